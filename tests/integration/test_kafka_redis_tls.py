"""On a cluster of several hosts (`cluster up --hosts`: TLS by default) Kafka and Redis speak TLS only: a client in
clear, or one that does not trust the cluster CA, gets nothing; one trusting it logs in as before. A packet capture
on the hosts' bridge shows neither a Kafka record nor a Redis or Kafka password in clear."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic

from blobstore_server.cluster import pki
from blobstore_server.cluster.kafka_auth import ADMIN, kafka_password, kafka_user
from blobstore_server.cluster.launcher import SECRET_FILE, ClusterInfo, cluster_ca, restart
from blobstore_server.cluster.redis_auth import redis_password, with_credentials
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.rpc.auth import new_secret
from tests.support.launched import SMALL
from tests.support.processes import wait_until

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


@pytest.fixture
def capture(cluster: ClusterInfo, tmp_path: Path) -> Iterator[Callable[[], bytes]]:
    """A capture of every TCP packet on the hosts' bridge from now on; calling it ends the capture and gives the
    pcap file's bytes (tcpdump writes the last of them out as it exits)."""
    net = cluster.net()
    assert net is not None
    pcap = tmp_path / "bridge.pcap"
    dump = subprocess.Popen(["tcpdump", "-i", net.bridge, "-s", "0", "--immediate-mode", "-w", str(pcap), "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def packets() -> bytes:
        dump.terminate()
        dump.wait(10)
        return pcap.read_bytes()

    try:
        assert dump.stderr is not None
        assert b"listening on" in dump.stderr.readline()  # capturing from here on
        yield packets
    finally:
        if dump.poll() is None:
            dump.terminate()
            dump.wait(10)


def test_a_capture_on_the_bridge_shows_no_record_or_password_in_clear(cluster: ClusterInfo, secret: str, ca: str,
                                                                      capture: Callable[[], bytes]) -> None:
    """Sought: a record written and read, Redis' password (our client logs in), and the Kafka admin's
    password, which a restarted broker sends (SASL PLAIN) to the controllers as it rejoins."""
    broker = next(p for p in ClusterInfo.load(Path(cluster.dir)).processes if p.role == "kafka")
    os.kill(broker.pid, signal.SIGTERM)
    wait_until(lambda: not broker.running, 30, f"{broker.name} to stop")
    restart(Path(cluster.dir), broker.name, timeout=90)  # back once every broker serves
    marker = f"blobstore-tls-probe-{secrets.token_hex(8)}".encode()
    control = f"blobstore-clear-probe-{secrets.token_hex(8)}".encode()
    login = client_auth(kafka_user(secret, ADMIN, ca))
    topic = f"tls-probe-{secrets.token_hex(4)}"
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap, **login})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, **login})
    producer.produce(topic, marker)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "tls-probe",
                                         "auto.offset.reset": "earliest", **login})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        read: list[bytes | None] = []
        while not read and time.monotonic() < deadline:
            read = [m.value() for m in consumer.consume(1, timeout=1) if m.error() is None]
        assert read == [marker]
    finally:
        consumer.close()
        admin.delete_topics([topic])[topic].result(30)
    with redis.Redis.from_url(with_credentials(cluster.redis_url, secret), ssl_ca_certs=ca) as cache:
        cache.set(topic, marker, ex=60)
        assert cache.get(topic) == marker
    _in_clear(_redis_address(cluster), control)  # the capture sees what crosses the bridge in clear
    seen = capture()
    assert control in seen, "the capture missed the probe sent in clear: it proves nothing"
    assert marker not in seen
    for password in (redis_password(secret), kafka_password(secret, ADMIN)):
        assert password.encode() not in seen
