"""The cluster spec (cluster/spec.py) and its per-host bundles (cluster/render.py, `blobstore deploy`): the
example spec renders into what an operator installs on six machines, and each kind of bad spec is one clear
error that writes nothing."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner, Result

from blobstore_server.cli.cli import app
from blobstore_server.cluster import pki
from blobstore_server.cluster.plan import (
    CAPABILITIES,
    EXPORT_BUCKET,
    EXPORT_ROOT,
    EXPORT_USER,
    export_access,
    plan_spec,
)
from blobstore_server.cluster.spec import ClusterSpec, Services, SpecError, for_hosts, load, parse
from blobstore_server.libs.proto import scheduler as api
from blobstore_server.libs.rpc.auth import IDENTITY_BOUND, new_secret
from blobstore_server.services.access.config import AccessConfig
from blobstore_server.services.allocator.config import AllocatorConfig
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.clustermgr.config import ClusterMgrConfig
from blobstore_server.services.dashboard.config import DashboardConfig
from blobstore_server.services.mqproxy.config import MqProxyConfig
from blobstore_server.services.s3.config import S3Config
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.tinker.config import TinkerConfig
from blobstore_server.services.worker.config import WorkerConfig
from tests.support.tickets import ticket_keys

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "cluster.example.toml"
MODELS: dict[str, type[BaseModel]] = {
    "access": AccessConfig, "allocator": AllocatorConfig, "blobnode": BlobnodeConfig, "clustermgr": ClusterMgrConfig,
    "dashboard": DashboardConfig, "mqproxy": MqProxyConfig, "scheduler": SchedulerConfig, "tinker": TinkerConfig,
    "worker": WorkerConfig, "s3": S3Config}


def _cli(*args: str) -> Result:
    """The `blobstore` command, run in this process."""
    return CliRunner().invoke(app, list(args))


def test_the_example_renders_a_bundle_per_host_with_what_each_machine_runs(tmp_path: Path) -> None:
    spec = load(EXAMPLE)
    done = _cli("deploy", "render", str(EXAMPLE), "--out", str(tmp_path / "out"))
    assert done.exit_code == 0, done.output
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [f"h{i}" for i in range(1, 7)]
    assert stat.S_IMODE((out / "cluster.secret").stat().st_mode) == 0o600
    assert (out / pki.CA_FILE).read_text() == (out / "h1" / "config" / pki.CA_FILE).read_text(), "the operator's copy"
    seen_roles: set[str] = set()
    for host in spec.hosts:
        bundle = out / host.name
        tls = {pki.CA_FILE, pki.CERT_FILE, pki.KEY_FILE}
        assert tls <= {p.name for p in (bundle / "config").iterdir()}, "each host gets its certificate and the CA"
        assert stat.S_IMODE((bundle / "config" / pki.KEY_FILE).stat().st_mode) == 0o600
        configs = sorted(p for p in (bundle / "config").iterdir() if p.name not in tls)
        roles = sorted(p.name.split(".")[0] for p in configs)
        expected = sorted(r for r in (*MODELS, "kafka", "redis") if host in spec.hosts_of(r))
        assert roles == expected, host.name
        seen_roles.update(roles)
        for path in configs:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            role = path.name.split(".")[0]
            if role in MODELS:
                raw = json.loads(path.read_text())
                config = MODELS[role].model_validate(raw)
                assert set(raw) <= set(type(config).model_fields), f"{path}: keys the service ignores"
                bind = raw["members"][str(spec.services.clustermgr.index(host.name) + 1)]["http_addr"] \
                    if role == "clustermgr" else raw["bind_addr"]
                assert bind == f"{host.address}:{getattr(spec.ports, role)}"
                shared = [c for c in CAPABILITIES[role] if c not in IDENTITY_BOUND]  # the others: its identity's
                assert sorted(raw["auth"]["keys"]) == sorted(shared), path  # only what it needs
                assert sorted((raw["auth"].get("identity") or {}).get("keys", {})) == sorted(
                    c for c in CAPABILITIES[role] if c in IDENTITY_BOUND), path
                assert "admin" not in raw["auth"]["keys"] or role == "clustermgr", path
                assert bool(raw["auth"].get("identities")) == (role == "clustermgr"), path
                if role in ("blobnode", "allocator"):  # it signs its disk reports or leases as itself
                    assert raw["auth"]["identity"]["name"] == f"https://{bind}", path
            unit = (bundle / "systemd" / f"blobstore-{role}.service").read_text()
            for line in ("Restart=on-failure", "LimitNOFILE=1048576", "After=network-online.target",
                         f"User={spec.user}", "WantedBy=blobstore.target", str(spec.config_dir_of(host) / path.name)):
                assert line in unit, (role, line)
        target = (bundle / "systemd" / "blobstore.target").read_text()
        assert all(f"blobstore-{r}.service" in target for r in roles)
        readme = (bundle / "README.md").read_text()
        assert "systemctl enable --now blobstore.target" in readme and host.address in readme
    assert seen_roles == {*MODELS, "kafka", "redis"}
    blobnode = json.loads((out / "h4" / "config" / "blobnode.json").read_text())
    assert (blobnode["hostname"], blobnode["rack"], blobnode["disks"]) == ("h4", "r2", [{"path": "/data/disk1"},
                                                                                         {"path": "/data/disk2"}])
    clustermgr = json.loads((out / "h3" / "config" / "clustermgr.json").read_text())
    assert clustermgr["chunk_size"] == spec.chunk_size and clustermgr["first_volume_after_disks"] == 12
    kafka = (out / "h2" / "config" / "kafka.properties").read_text()
    assert "controller.quorum.voters=1@10.0.2.12:9093,2@10.0.2.14:9093,3@10.0.2.16:9093" in kafka
    assert "default.replication.factor=3" in kafka and "min.insync.replicas=2" in kafka
    access = [json.loads((out / h / "config" / "access.json").read_text()) for h in ("h1", "h4")]
    assert access[0]["secret"] == access[1]["secret"]  # a Location signed by one reads through the other
    gateway = (out / "h1" / "systemd" / "blobstore-s3.service").read_text()
    assert "-m blobstore_server.services.s3 -c /etc/blobstore/s3.json" in gateway
    assert "`s3-h1`: 10.0.1.11:9400" in (out / "h1" / "README.md").read_text()
    again = tmp_path / "again"
    (again).mkdir()
    (again / "cluster.secret").write_text((out / "cluster.secret").read_text())
    assert _cli("deploy", "render", str(EXAMPLE), "--out", str(again)).exit_code == 0
    assert (again / "h1" / "config" / "access.json").read_text() == (out / "h1" / "config" / "access.json").read_text()


BAD = {
    "two processes on one address:port": (
        ('address = "10.0.2.16"', 'address = "10.0.2.14"'), "both listen on 10.0.2.14:8889"),
    "an even number of clustermgr": (
        ('clustermgr = ["h1", "h3", "h5"]', 'clustermgr = ["h1", "h3"]'), "Raft needs an odd number"),
    "too few hosts for the widest code mode": (
        ('code_modes = ["EC3P3"]', 'code_modes = ["EC3P3", "EC6P3"]'), "EC6P3 puts its 9 units on distinct hosts"),
    "the S3 gateway on its access node's port": (("s3 = 9400", "s3 = 9500"), "both listen on 10.0.1.11:9500"),
    "an unknown key": (("[redis]", "[redis]\nport = 6379"), "redis.port: unknown key"),
    "a service on an undeclared host": (('tinker = ["h6"]', 'tinker = ["h7"]'), "services.tinker names undeclared"),
    "both our brokers and the operator's": (("[kafka]", '[kafka]\nbootstrap = ["k1:9092"]'), "exactly one of them"),
    "an ISR larger than the replication": (("min_insync_replicas = 2", "min_insync_replicas = 4"),
                                          "exceeds replication_factor"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_spec_is_one_error_naming_the_problem_and_writes_nothing(tmp_path: Path, case: str) -> None:
    (old, new), message = BAD[case]
    text = EXAMPLE.read_text()
    assert old in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError, match=message.replace("[", r"\[")):
        parse(bad.read_text())
    for command in (("deploy", "check", str(bad)), ("deploy", "render", str(bad), "--out", str(tmp_path / "out"))):
        done = _cli(*command)
        assert done.exit_code == 1
        assert done.stderr.startswith("error: ") and message in " ".join(done.stderr.split()), done.stderr
    assert not (tmp_path / "out").exists()


def test_cluster_up_hosts_spec_spreads_roles_and_racks(tmp_path: Path) -> None:
    hosts = [(f"h{i}", f"10.77.9.{10 + i}") for i in range(1, 7)]
    spec = for_hosts(hosts, 2, tmp_path)
    assert [h.rack for h in spec.hosts] == ["r1", "r2"] * 3
    assert spec.services.kafka == ["h4", "h5", "h6"] and spec.kafka.replication_factor == 3
    assert spec.services.clustermgr == ["h1", "h2", "h3"]
    assert not {"tinker", "mqproxy", "access", "clustermgr"} & {r for r in Services.model_fields
                                                               if "h6" in getattr(spec.services, r)}
    with pytest.raises(SpecError, match="EC3P3 puts its 6 units on distinct hosts, but only 5"):
        for_hosts(hosts[:5], 2, tmp_path)
    eight = for_hosts([*hosts, ("h7", "10.77.9.17"), ("h8", "10.77.9.18")], 2, tmp_path)
    assert eight.services.access == ["h7", "h8"]  # alone, so that a partition can cut access off from the rest
    assert [r for r in Services.model_fields if {"h7", "h8"} & set(getattr(eight.services, r))] == ["access"]
    assert not {"tinker", "mqproxy"} & {r for r in Services.model_fields
                                        if set(eight.services.kafka) & set(getattr(eight.services, r))}


def test_a_spec_runs_one_s3_gateway_on_the_first_access_host_writing_through_every_access_node(tmp_path: Path) -> None:
    """One, unless the spec names a shared namespace (a SQLite file is one machine's)."""
    spec = load(EXAMPLE)
    plan = plan_spec(spec, "python", new_secret())
    (gateway,) = plan.of_role("s3")
    assert (gateway.name, gateway.host, gateway.url) == ("s3-h1", "h1", "https://10.0.1.11:9400")
    config = S3Config.model_validate_json(gateway.config_text)
    access = {p.host: p.url for p in plan.of_role("access")}
    assert config.access_hosts == [access["h1"], access["h4"]]  # its own host's first
    assert config.namespace == "/var/lib/blobstore/s3-h1/namespace.db"
    assert ("s3-h1", "10.0.1.11", 9400) in list(spec.listeners())
    eight = for_hosts([(f"h{i}", f"10.77.9.{10 + i}") for i in range(1, 9)], 2, tmp_path)
    assert [(p.name, p.host) for p in plan_spec(eight, "python", new_secret()).of_role("s3")] == [("s3-h7", "h7")]


def test_a_spec_with_a_postgresql_namespace_runs_a_gateway_on_every_access_host_sharing_it() -> None:
    dsn = "postgresql://s3@10.0.1.20:5432/namespace"
    spec = load(EXAMPLE).model_copy(update={"s3_namespace": dsn})
    plan = plan_spec(spec, "python", new_secret())
    gateways = plan.of_role("s3")
    assert [(p.name, p.host) for p in gateways] == [("s3-h1", "h1"), ("s3-h4", "h4")]
    assert {S3Config.model_validate_json(p.config_text).namespace for p in gateways} == {dsn}
    assert ("s3-h4", "10.0.2.14", 9400) in list(spec.listeners())
    with pytest.raises(ValidationError, match="s3_namespace"):
        ClusterSpec.model_validate({**spec.model_dump(), "s3_namespace": "/var/lib/namespace.db"})


def test_every_blobnode_writes_inspection_exports_to_the_first_gateways_bucket_as_the_cli_reads_them() -> None:
    """The bucket is how `inspect run` works across hosts: the keys derive from the cluster secret, so the
    gateways set the user up, the blobnodes write as it and the operator's CLI reads as it, all from one secret."""
    secret = new_secret()
    spec = load(EXAMPLE).model_copy(update={"s3_namespace": "postgresql://s3@10.0.1.20:5432/namespace"})
    plan = plan_spec(spec, "python", secret)
    first = plan.of_role("s3")[0].url
    expected = export_access(secret, first)
    for gateway in plan.of_role("s3"):
        (user,) = S3Config.model_validate_json(gateway.config_text).service_users
        assert (user.name, user.access_key, user.secret_key, user.buckets) == (
            EXPORT_USER, expected.access_key, expected.secret_key, [EXPORT_BUCKET])
    for node in plan.of_role("blobnode"):
        config = BlobnodeConfig.model_validate_json(node.config_text)
        assert config.export_s3 == expected and EXPORT_ROOT in config.export_roots
    assert export_access(new_secret(), first) != expected


def test_the_operators_kafka_and_redis_are_used_and_not_rendered(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace('kafka = ["h2", "h4", "h6"]\n', "").replace('redis = ["h1"]\n', "")
    text = text.replace("[kafka]", '[kafka]\nbootstrap = ["k1.example:9092", "k2.example:9092"]')
    text = text.replace('url = ""', 'url = "redis://cache.example:6379/0"')
    (tmp_path / "spec.toml").write_text(text)
    done = _cli("deploy", "render", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "out"))
    assert done.exit_code == 0, done.output
    rendered = {p.name for p in (tmp_path / "out").glob("*/config/*")}
    assert not rendered & {"kafka.properties", "redis.conf"}
    tinker = json.loads((tmp_path / "out" / "h6" / "config" / "tinker.json").read_text())
    access = json.loads((tmp_path / "out" / "h1" / "config" / "access.json").read_text())
    assert tinker["kafka_bootstrap"] == "k1.example:9092,k2.example:9092"
    assert access["redis_url"] == "redis://cache.example:6379/0"


def test_a_worker_holds_the_capability_of_every_task_call_it_sends() -> None:
    """Its cancel (a failed destination, a lost source) was once `task-control`, an operator's: every one refused."""
    for route in (api.TASK_ACQUIRE, api.TASK_RENEW, api.TASK_REPORT, api.TASK_COMPLETE, api.TASK_CANCEL):
        assert route.capability in CAPABILITIES["worker"], route.path


def test_a_spec_gives_each_tickets_private_key_to_its_minter_alone_and_the_public_keys_to_each_blobnode() -> None:
    """What `deploy render` and `cluster up --hosts` write: clustermgr signs release tickets, the scheduler discard
    tickets, tinker delete tickets; blobnodes verify."""
    secret = new_secret()
    plan = plan_spec(load(EXAMPLE), "python", secret)
    roles = {p.role for p in plan.processes if p.role not in ("kafka", "redis")}
    for process in (p for p in plan.processes if p.role in roles):
        signing, public = ticket_keys(secret, process.role)
        auth = json.loads(process.config_text)["auth"]
        assert auth.get("ticket_signing_key") == signing, process.name
        assert auth.get("ticket_public_keys", {}) == public, process.name
    assert {"clustermgr", "blobnode", "scheduler", "tinker"} <= roles


def _urls(value: object) -> list[str]:
    """Every URL in a config (JSON value), at any depth."""
    if isinstance(value, dict):
        return [u for v in value.values() for u in _urls(v)]
    if isinstance(value, list):
        return [u for v in value for u in _urls(v)]
    return [value] if isinstance(value, str) and "://" in value else []


def test_with_tls_every_http_service_serves_https_and_every_url_between_them_is_https() -> None:
    spec = load(EXAMPLE)
    assert spec.tls, "on by default"
    plan = plan_spec(spec, "python", new_secret())
    services = [p for p in plan.processes if p.role in MODELS]
    assert {p.role for p in services} == set(MODELS)
    for p in services:
        config = json.loads(p.config_text)
        folder = spec.config_dir_of(spec.host(p.host))
        assert config["tls"] == {"cert_file": str(folder / pki.CERT_FILE), "key_file": str(folder / pki.KEY_FILE),
                                 "ca_file": str(folder / pki.CA_FILE)}, p.name
        assert p.url.startswith("https://"), p.name
        assert MODELS[p.role].model_validate(config).scheme == "https"
        http = [u for u in _urls(config) if u.split("://")[0] in ("http", "s3")]
        assert http == [EXPORT_ROOT] * (p.role == "blobnode"), f"{p.name}: {http}"  # s3://bucket/ is no link
    assert {p.url.split("://")[0] for p in plan.processes if p.role not in MODELS} == {"rediss"}
    plain = plan_spec(spec.model_copy(update={"tls": False}), "python", new_secret())
    assert not plain.tls
    for p in plain.processes:
        if p.role in MODELS:
            config = json.loads(p.config_text)
            assert "tls" not in config and not [u for u in _urls(config) if u.startswith("https://")], p.name
