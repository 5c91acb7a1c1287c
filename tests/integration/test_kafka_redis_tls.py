"""On a cluster of several hosts (`cluster up --hosts`: TLS by default) Kafka and Redis speak TLS only: a client in
clear, or one that does not trust the cluster CA, gets nothing; one trusting it logs in as before. (A capture of the
hosts' bridge: tests/integration/test_cluster_capture.py.)"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import redis
from confluent_kafka.admin import AdminClient

from blobstore_server.cluster import pki
from blobstore_server.cluster.kafka_auth import ADMIN, kafka_user
from blobstore_server.cluster.launcher import SECRET_FILE, ClusterInfo, cluster_ca
from blobstore_server.cluster.redis_auth import with_credentials
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.rpc.auth import new_secret
from tests.support.launched import SMALL

LAUNCH = SMALL  # the launched `cluster` (tests/conftest.py)
pytestmark = pytest.mark.skipif(not SMALL.hosts, reason="hosts are network namespaces (root only); 127.0.0.1 is clear")


@pytest.fixture
def secret(cluster: ClusterInfo) -> str:
    return (Path(cluster.dir) / SECRET_FILE).read_text().strip()


@pytest.fixture
def ca(cluster: ClusterInfo) -> str:
    found = cluster_ca(Path(cluster.dir))
    assert found is not None, "cluster up --hosts writes the cluster CA beside its secret"
    return found


@pytest.fixture
def foreign_ca(tmp_path: Path) -> str:
    """Another cluster's CA: certificates of ours do not chain to it."""
    path = tmp_path / "foreign-ca.pem"
    path.write_text(pki.ca_certificate(new_secret()))
    return str(path)


def _brokers(cluster: ClusterInfo, config: dict[str, Any]) -> int:
    """How many brokers a client with `config` is shown; 0 when it gets no answer."""
    try:
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap, **config})
        return len(admin.list_topics(timeout=5).brokers)
    except confluent_kafka.KafkaException:
        return 0


def test_kafka_answers_only_a_sasl_ssl_client_trusting_the_cluster_ca(cluster: ClusterInfo, secret: str, ca: str,
                                                                       foreign_ca: str) -> None:
    good = client_auth(kafka_user(secret, ADMIN, ca))
    assert good["security.protocol"] == "SASL_SSL"
    clients = {
        "SASL_SSL trusting the CA": good,
        "the same login in clear (SASL_PLAINTEXT)": {**good, "security.protocol": "SASL_PLAINTEXT"},
        "no login, in clear (PLAINTEXT)": {},
        "SASL_SSL trusting only the system's CAs": {k: v for k, v in good.items() if k != "ssl.ca.location"},
        "SASL_SSL trusting another cluster's CA": {**good, "ssl.ca.location": foreign_ca},
    }
    with ThreadPoolExecutor(len(clients)) as pool:  # each refusal shows as a timeout: wait them out together
        seen = dict(zip(clients, pool.map(lambda c: _brokers(cluster, c), clients.values()), strict=True))
    brokers = sum(p.role == "kafka" for p in cluster.processes)
    assert seen == {name: brokers if name == "SASL_SSL trusting the CA" else 0 for name in clients}


def _redis_address(cluster: ClusterInfo) -> tuple[str, int]:
    assert cluster.redis_url.startswith("rediss://"), cluster.redis_url
    host, port = cluster.redis_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    return host, int(port)


def _in_clear(address: tuple[str, int], command: bytes = b"PING") -> bytes:
    """What Redis' port answers `command` sent in clear, as a client without TLS sends it."""
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(command + b"\r\n")
        try:
            return s.recv(64)
        except OSError:  # reset, or no answer at all
            return b""


def test_redis_answers_only_over_tls_to_a_client_trusting_the_ca_with_the_password(cluster: ClusterInfo, secret: str,
                                                                                   ca: str, foreign_ca: str) -> None:
    answer = _in_clear(_redis_address(cluster))
    assert not answer.startswith((b"+", b"-")), answer  # neither PONG nor NOAUTH: no RESP in clear at all
    url = with_credentials(cluster.redis_url, secret)
    with pytest.raises(redis.ConnectionError):  # the password in clear: refused before it is read
        redis.Redis.from_url(url.replace("rediss://", "redis://", 1), socket_timeout=5).ping()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, ssl_ca_certs=foreign_ca, socket_timeout=5).ping()
    with pytest.raises(redis.AuthenticationError):  # TLS does not replace the password
        redis.Redis.from_url(cluster.redis_url, ssl_ca_certs=ca, socket_timeout=5).ping()
    with redis.Redis.from_url(url, ssl_ca_certs=ca, socket_timeout=5) as good:
        assert good.ping()
