"""Kafka and Redis over TLS when a spec says `tls` (its default): what the plan and the bundle give the brokers,
Redis and their clients (cluster/kafka_broker.py, cluster/plan.py, cluster/render.py). With `tls` off, and on a
local `cluster up`, nothing of it is there. Real processes prove it in tests/integration/test_kafka_redis_tls.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from blobstore_server.cluster import pki, render
from blobstore_server.cluster.plan import ClusterPlan, ClusterShape, plan_cluster, plan_spec, tls_files
from blobstore_server.cluster.spec import ClusterSpec, load
from blobstore_server.libs.mq.settings import KafkaAuth, client_auth
from blobstore_server.libs.rpc.auth import new_secret
from blobstore_server.services.access.config import AccessConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "cluster.example.toml"
KAFKA_CLIENTS = {"mqproxy": "kafka_auth", "tinker": "kafka_auth", "dashboard": "kafka_auth"}


def _spec(tls: bool) -> ClusterSpec:
    return load(EXAMPLE).model_copy(update={"tls": tls})


def _properties(text: str) -> dict[str, str]:
    """A .properties file as Java reads it: a line ending in `\\` goes on with the next, its indent dropped."""
    joined = re.sub(r"\\\n\s*", "", text)
    return dict(line.split("=", 1) for line in joined.splitlines() if line and not line.startswith("#"))


def _pem_body(pem: str) -> str:
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))


def _broker_properties(spec: ClusterSpec, plan: ClusterPlan) -> dict[str, dict[str, str]]:
    return {f.path.parts[0]: _properties(f.text) for f in render.bundle(spec, plan)
            if f.path.name == "kafka.properties"}


def test_with_tls_every_broker_listener_is_sasl_ssl_with_its_hosts_certificate_inline() -> None:
    spec, secret = _spec(True), new_secret()
    plan = plan_spec(spec, "python", secret)
    brokers = _broker_properties(spec, plan)
    assert sorted(brokers) == sorted(h.name for h in spec.hosts_of("kafka"))
    for host, props in brokers.items():
        address = spec.host(host).address
        assert props["listeners"] == f"SASL_SSL://{address}:9092,CONTROLLER://{address}:9093"
        assert props["advertised.listeners"] == f"SASL_SSL://{address}:9092"
        assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL"
        assert props["inter.broker.listener.name"] == "SASL_SSL"
        assert props["sasl.mechanism.controller.protocol"] == "PLAIN"  # SCRAM cannot authenticate a controller
        assert "ScramLoginModule" in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
        assert (props["ssl.keystore.type"], props["ssl.truststore.type"]) == ("PEM", "PEM")
        mine = plan.tls[host]
        for key, pem in (("ssl.keystore.key", mine.key), ("ssl.keystore.certificate.chain", mine.cert),
                         ("ssl.truststore.certificates", mine.ca)):
            value = props[key]  # Kafka's PEM parser takes the base64 between the markers, whitespace and all
            assert value.startswith(pem.splitlines()[0]) and value.endswith(pem.strip().splitlines()[-1]), key
            assert re.sub(r"\s|-----[A-Z ]+-----", "", value) == _pem_body(pem), key
        assert not any("PLAINTEXT" in v for k, v in props.items() if "listener" in k)


def test_with_tls_every_kafka_client_trusts_its_hosts_ca_copy_and_the_tools_do_too() -> None:
    spec, secret = _spec(True), new_secret()
    plan = plan_spec(spec, "python", secret)
    for role, field in KAFKA_CLIENTS.items():
        for process in plan.of_role(role):
            auth = KafkaAuth.model_validate(json.loads(process.config_text)[field])
            files = tls_files(spec, process.host)
            assert files is not None and auth.ca_file == files.ca_file, process.name
            assert client_auth(auth)["security.protocol"] == "SASL_SSL"
            assert client_auth(auth)["ssl.ca.location"] == files.ca_file
    for f in render.bundle(spec, plan):
        if f.path.name == "kafka-admin.properties":
            props = _properties(f.text)
            assert props["security.protocol"] == "SASL_SSL"
            assert props["ssl.truststore.location"] == str(spec.config_dir_of(spec.host(f.path.parts[0]))
                                                         / pki.CA_FILE)


def test_with_tls_redis_listens_on_its_tls_port_only_and_the_access_nodes_verify_it() -> None:
    spec, secret = _spec(True), new_secret()
    plan = plan_spec(spec, "python", secret)
    (redis,) = plan.of_role("redis")
    files = tls_files(spec, redis.host)
    assert files is not None
    lines = redis.config_text.splitlines()
    for line in ("port 0", "tls-port 6379", f"tls-cert-file {files.cert_file}", f"tls-key-file {files.key_file}",
                 f"tls-ca-cert-file {files.ca_file}", "tls-auth-clients no"):
        assert line in lines, line
    assert "user default off" in lines  # the password stays
    assert redis.url.startswith("rediss://")
    for node in plan.of_role("access"):
        config = AccessConfig.model_validate_json(node.config_text)
        own = tls_files(spec, node.host)
        assert own is not None
        assert config.redis_url.startswith("rediss://") and config.redis_ca_file == own.ca_file


@pytest.mark.parametrize("where", ["spec without tls", "local cluster up"])
def test_without_tls_kafka_and_redis_stay_as_they_were(tmp_path: Path, where: str) -> None:
    if where == "local cluster up":
        plan = plan_cluster(tmp_path, ClusterShape(), iter(range(20000, 21000)), "python", "location-secret",
                            new_secret())
        brokers = {}
    else:
        spec = _spec(False)
        plan = plan_spec(spec, "python", new_secret())
        brokers = _broker_properties(spec, plan)
        assert brokers
    for props in brokers.values():
        assert props["inter.broker.listener.name"] == "SASL_PLAINTEXT"
        assert not [k for k in props if k.startswith("ssl.")]
    (redis,) = plan.of_role("redis")
    assert "tls-" not in redis.config_text and f"port {redis.port}" in redis.config_text.splitlines()
    assert redis.url.startswith("redis://")
    for node in plan.of_role("access"):
        assert AccessConfig.model_validate_json(node.config_text).redis_ca_file == ""
    for role, field in KAFKA_CLIENTS.items():
        for process in plan.of_role(role):
            auth = KafkaAuth.model_validate(json.loads(process.config_text)[field])
            assert auth.ca_file is None and client_auth(auth)["security.protocol"] == "SASL_PLAINTEXT"


def test_the_operators_kafka_and_redis_keep_what_they_have_under_tls(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace('kafka = ["h2", "h4", "h6"]\n', "").replace('redis = ["h1"]\n', "")
    text = text.replace("[kafka]", '[kafka]\nbootstrap = ["k1.example:9092"]')
    text = text.replace('url = ""', 'url = "rediss://cache.example:6380/0"')
    (tmp_path / "spec.toml").write_text(text)
    spec = load(tmp_path / "spec.toml")
    assert spec.tls
    plan = plan_spec(spec, "python", new_secret())
    for role, field in KAFKA_CLIENTS.items():
        for process in plan.of_role(role):
            assert json.loads(process.config_text).get(field) is None  # no login of ours, no CA of ours
    for node in plan.of_role("access"):
        config = AccessConfig.model_validate_json(node.config_text)
        assert (config.redis_url, config.redis_ca_file) == ("rediss://cache.example:6380/0", "")
