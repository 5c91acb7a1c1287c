"""What `blobstore cluster up` plans (cluster/plan.py), without starting anything: two allocators per cluster,
two access nodes each given every allocator, an S3 gateway beside each, and exactly `port_count` ports drawn; a
cluster.json written before there were several access nodes still loads, and `cluster status --json` lists the
gateways."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from blobstore_server.cli.cli import app
from blobstore_server.cluster import pki
from blobstore_server.cluster.launcher import STATE_FILE, ClusterInfo, ProcessRecord
from blobstore_server.cluster.plan import (
    LOCAL_HOST,
    MINTS,
    ROLES,
    STAGES,
    ClusterPlan,
    ClusterShape,
    ProcessSpec,
    derived,
    kafka_cluster_uuid,
    plan_cluster,
    port_count,
)
from blobstore_server.cluster.service_auth import role_auth
from blobstore_server.libs.rpc.auth import SECRET_ENV, new_secret
from blobstore_server.libs.rpc.config import load_config
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.clustermgr.config import ClusterMgrConfig
from tests.support.tickets import ticket_keys


class Ports:
    """Hands out 20000, 20001, ... and counts how many were taken."""

    def __init__(self) -> None:
        self.taken = 0

    def __iter__(self) -> Iterator[int]:
        while True:
            self.taken += 1
            yield 19999 + self.taken


def _plan(tmp_path: Path, shape: ClusterShape) -> tuple[ClusterPlan, int]:
    ports = Ports()
    plan = plan_cluster(tmp_path, shape, iter(ports), "python", "location-secret", new_secret())
    return plan, ports.taken


def _config(spec: ProcessSpec) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(spec.config_text)
    return config


def _named(plan: ClusterPlan) -> dict[str, ProcessSpec]:
    return {p.name: p for p in plan.processes}


def test_the_default_plan_runs_two_allocators_and_two_access_nodes_each_given_both(tmp_path: Path) -> None:
    shape = ClusterShape()
    plan, _ = _plan(tmp_path, shape)
    named = _named(plan)
    assert [p.name for p in plan.of_role("allocator")] == ["allocator1", "allocator2"]
    assert [p.name for p in plan.of_role("access")] == ["access1", "access2"]
    assert len(named) == len(plan.processes)  # names are unique: restart, status and down go by name
    allocator_urls = [named["allocator1"].url, named["allocator2"].url]
    assert len(set(allocator_urls)) == 2
    for name in ("allocator1", "allocator2"):
        assert _config(named[name])["code_modes"] == [shape.code_mode.name]
        assert named[name].workdir == tmp_path.resolve() / name
    access = [_config(named[name]) for name in ("access1", "access2")]
    for name, config in zip(("access1", "access2"), access, strict=True):
        workdir = tmp_path.resolve() / name
        assert named[name].workdir == workdir
        assert config["allocator_hosts"] == allocator_urls
        assert config["bind_addr"] == named[name].url.removeprefix("http://")
        assert config["orphan_log"] == str(workdir / "orphans.jsonl")
        assert config["state_file"] == str(workdir / "state.sqlite")  # one each: two processes never share one
        assert config["audit_log"] == str(workdir / "audit.jsonl")
        assert config["region"] == []
    assert access[0]["bind_addr"] != access[1]["bind_addr"]
    alike = ("bind_addr", "orphan_log", "state_file", "audit_log")
    assert {k: v for k, v in access[0].items() if k not in alike} == {
        k: v for k, v in access[1].items() if k not in alike}  # the same secret, keys and hosts
    assert access[0]["secret"] == "location-secret"
    targets = {t["name"] for t in _config(named["dashboard"])["targets"]}
    assert {"allocator1", "allocator2", "access1", "access2"} <= targets


def test_an_s3_gateway_beside_each_access_node_writes_through_all_of_them_into_one_namespace(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path, ClusterShape(access_nodes=3))
    access = [p.url for p in plan.of_role("access")]
    gateways = plan.of_role("s3")
    assert [p.name for p in gateways] == ["s3gw1", "s3gw2", "s3gw3"]
    configs = [_config(p) for p in gateways]
    assert [c["access_hosts"] for c in configs] == [access, [access[1], access[0], access[2]],
                                                    [access[2], access[0], access[1]]]  # its own access node first
    # one SQLite file for all (one machine): in the first gateway's folder, which `cluster up` makes and wipes
    assert {c["namespace"] for c in configs} == {str(gateways[0].workdir / "namespace.db")}
    assert [c["bind_addr"] for c in configs] == [p.url.removeprefix("http://") for p in gateways]
    assert gateways[0].command[1:3] == ("-m", "blobstore_server.services.s3")
    (dashboard,) = plan.of_role("dashboard")
    targets = [(t["name"], t["role"], t["url"]) for t in _config(dashboard)["targets"] if t["role"] == "s3"]
    assert targets == [(p.name, "s3", p.url) for p in gateways]  # scraped, so on the dashboard and in its metrics
    stage = {role: n for n, roles in enumerate(STAGES) for role in roles}
    assert stage["s3"] > stage["access"]  # the access nodes answer before a gateway starts


@pytest.mark.parametrize("shape", [ClusterShape(), ClusterShape(blobnodes=8, clusters=2),
                                   ClusterShape(allocators=1, access_nodes=1),
                                   ClusterShape(allocators=3, access_nodes=3, clusters=3)])
def test_port_count_is_the_ports_the_plan_draws(tmp_path: Path, shape: ClusterShape) -> None:
    plan, taken = _plan(tmp_path, shape)
    assert taken == port_count(shape)
    kafka = [p for b in plan.kafka.brokers for p in (b.place.port, b.place.second_port)]
    used = [p.port for p in plan.processes] + kafka
    raft = [int(m["raft_addr"].rsplit(":", 1)[1]) for p in plan.of_role("clustermgr")
            for m in _config(p)["members"].values()]
    assert len(set(used) | set(raft)) == taken  # every port drawn is used, by one process only


def test_fewer_allocators_and_access_nodes_keep_their_numbered_names(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path, ClusterShape(allocators=1, access_nodes=1))
    assert [p.name for p in plan.of_role("allocator")] == ["allocator1"]
    assert [p.name for p in plan.of_role("access")] == ["access1"]
    assert _config(plan.of_role("access")[0])["allocator_hosts"] == [plan.of_role("allocator")[0].url]


def test_a_regions_access_nodes_know_every_allocator_of_each_cluster(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path, ClusterShape(clusters=2))
    assert [p.name for p in plan.of_role("allocator")] == ["allocator1", "allocator2", "c2-allocator1",
                                                           "c2-allocator2"]
    by_cluster = {k: [p.url for p in plan.of_role("allocator") if p.cluster_id == k] for k in (1, 2)}
    for access in plan.of_role("access"):
        config = _config(access)
        assert config["allocator_hosts"] == by_cluster[1]
        assert [(r["cluster_id"], r["allocator_hosts"]) for r in config["region"]] == [(2, by_cluster[2])]


@pytest.mark.parametrize("counts", [{"allocators": 0}, {"access_nodes": 0}])
def test_a_cluster_needs_an_allocator_and_an_access_node(counts: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="at least one"):
        ClusterShape(**counts)  # type: ignore[arg-type]


def test_a_cluster_json_from_before_several_access_nodes_loads(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)  # no secret anywhere: loading installs no signer
    old = {"dir": str(tmp_path), "access_url": "http://127.0.0.1:9500", "clustermgr_urls": ["http://127.0.0.1:9001"],
           "redis_url": "redis://127.0.0.1:6379/0", "code_mode": "EC3P3", "processes": []}
    (tmp_path / STATE_FILE).write_text(json.dumps(old))
    info = ClusterInfo.load(tmp_path)
    assert info.access_urls == ["http://127.0.0.1:9500"] and info.access_url == "http://127.0.0.1:9500"
    info.access_urls = ["http://127.0.0.1:9500", "http://127.0.0.1:9501"]
    info.save()
    assert ClusterInfo.load(tmp_path).access_urls == ["http://127.0.0.1:9500", "http://127.0.0.1:9501"]


def test_cluster_status_json_lists_each_gateway_with_its_role_and_url(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    plan, _ = _plan(tmp_path, ClusterShape(access_nodes=2))
    access = [p.url for p in plan.of_role("access")]
    records = [ProcessRecord(p.role, p.name, 0, 0, p.port, p.url, str(p.config_path), str(p.log_path))
               for p in plan.processes if p.role in ("access", "s3")]  # pid 0: none runs
    ClusterInfo(str(tmp_path), access[0], [], "redis://127.0.0.1:1/0", "EC3P3", processes=records,
                access_urls=access).save()
    done = CliRunner().invoke(app, ["cluster", "status", "--dir", str(tmp_path), "--json"])
    assert done.exit_code == 0, done.output
    listed = [(p["role"], p["name"], p["url"], p["running"]) for p in json.loads(done.stdout)["processes"]]
    assert [p for p in listed if p[0] == "s3"] == [("s3", p.name, p.url, False) for p in plan.of_role("s3")]


def test_a_kafka_cluster_id_never_starts_with_a_dash_and_stays_the_same_for_a_secret() -> None:
    """`kafka-storage format -t -x...` reads such an id as an option: one secret in 64 derived one (a CI run's
    --hosts cluster failed to format its brokers)."""
    def first_draw(secret: str) -> str:
        return base64.urlsafe_b64encode(derived(secret, "kafka cluster id", 16)).decode().rstrip("=")

    secrets = [f"{n:064x}" for n in range(2000)]
    dashed = [s for s in secrets if first_draw(s).startswith("-")]
    assert dashed  # about 2000 / 64 of them
    for secret in dashed:
        uuid = kafka_cluster_uuid(secret)
        assert not uuid.startswith("-") and len(uuid) == 22 and uuid == kafka_cluster_uuid(secret)
    plain = next(s for s in secrets if s not in dashed)
    assert kafka_cluster_uuid(plain) == first_draw(plain)  # ids of existing clusters do not change


@pytest.mark.parametrize("shape", [ClusterShape(), ClusterShape(clusters=2, disk_broken_after=None, audit_log=False)])
def test_every_config_the_plan_writes_loads_as_its_service_loads_it(tmp_path: Path, shape: ClusterShape) -> None:
    """Each process's config passes its service's own strict loader (no unknown key, every value valid), and a
    setting given as None (repair off) stays None rather than falling back to its default."""
    plan, _ = _plan(tmp_path, shape)
    models = {role: model for model, role in ROLES.items()}
    checked = set()
    for spec in plan.processes:
        if spec.role not in models:  # redis, kafka: not ours
            continue
        path = tmp_path / f"{spec.name}-{spec.cluster_id}.json"
        path.write_text(spec.config_text)
        config = load_config(path, models[spec.role])
        assert config.auth is not None and not config.insecure
        checked.add(spec.role)
        if isinstance(config, ClusterMgrConfig):
            assert config.disk_broken_after == shape.disk_broken_after
    assert checked == set(models)


def test_each_minter_holds_its_own_tickets_private_key_and_every_blobnode_the_public_keys(tmp_path: Path) -> None:
    """`cluster up` and a config written by `blobstore auth config` or a test (role_auth) give the same keys:
    clustermgr the release key, the scheduler the discard key, tinker the delete key, a blobnode the public ones."""
    secret = new_secret()
    plan = plan_cluster(tmp_path, ClusterShape(), iter(Ports()), "python", "location-secret", secret)
    assert MINTS == {"clustermgr": Kind.RELEASE, "scheduler": Kind.DISCARD, "tinker": Kind.DELETE,
                     "access": Kind.INTENT}
    for spec in plan.processes:
        if spec.role not in ROLES.values():
            continue
        signing, public = ticket_keys(secret, spec.role)
        auth = _config(spec)["auth"]
        assert auth.get("ticket_signing_key") == signing, spec.name
        assert auth.get("ticket_public_keys", {}) == public, spec.name
        written = role_auth(secret, spec.role, {"bind_addr": "127.0.0.1:1"})
        assert written.get("ticket_signing_key") == signing, spec.name
        assert written.get("ticket_public_keys", {}) == public, spec.name


def test_a_local_plan_with_tls_serves_every_http_service_over_https_with_its_folders_certificate(
        tmp_path: Path) -> None:
    """What bench/tls.py measures: HTTP and Raft on TLS, Kafka and Redis as before; without `tls` none of it."""
    plan, _ = _plan(tmp_path, ClusterShape(tls=True))
    root = tmp_path.resolve()
    assert set(plan.tls) == {LOCAL_HOST}
    for p in plan.processes:
        if p.role == "redis":
            assert p.url.startswith("redis://") and "tls-port" not in p.config_text
            continue
        config = _config(p)
        assert p.url.startswith("https://"), p.name
        assert config["tls"] == {"cert_file": str(root / pki.CERT_FILE), "key_file": str(root / pki.KEY_FILE),
                                 "ca_file": str(root / pki.CA_FILE)}, p.name
    assert _config(_named(plan)["mqproxy"])["kafka_auth"]["ca_file"] is None  # Kafka stays SASL_PLAINTEXT
    plain, _ = _plan(tmp_path, ClusterShape())
    assert not plain.tls and all("tls" not in _config(p) for p in plain.processes if p.role != "redis")
