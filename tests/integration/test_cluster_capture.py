"""Nothing crosses the network of a `--hosts` cluster in clear (issue 65 item 6). tcpdump records the bridge every
host hangs on while the SDK writes and reads an object, a Kafka record and a Redis value go back and forth, and a
clustermgr, a Kafka broker and an access node restart (so Raft, the Kafka controller's PLAIN login, Redis' AUTH and
fresh connections to every service are captured from their first byte). Every connection opened during the
capture starts with a TLS handshake, and neither the object's bytes, the record, the value, any Kafka or Redis
password, nor the cluster secret appear anywhere in it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic

from blobstore import Client
from blobstore_server.cluster.kafka_auth import ADMIN, kafka_user, scram_users
from blobstore_server.cluster.launcher import SECRET_FILE, SPEC_FILE, ClusterInfo, ProcessRecord, restart
from blobstore_server.cluster.pki import CA_FILE
from blobstore_server.cluster.redis_auth import redis_password, with_credentials
from blobstore_server.cluster.spec import load
from blobstore_server.libs.mq.settings import client_auth
from tests.support import pcap
from tests.support.launched import SMALL
from tests.support.processes import wait_until

LAUNCH = SMALL  # the launched `cluster` (tests/conftest.py)
TLS_HANDSHAKE = b"\x16\x03"  # a TLS record: handshake, version 3.x (every TLS version's ClientHello)


class Tcpdump:
    """tcpdump on one interface writing whole frames to `path`, stopped by its PID."""

    def __init__(self, interface: str, path: Path) -> None:
        self.path = path
        # immediate mode: otherwise the kernel's ring buffer holds packets up to a second, lost when it stops
        command = ["tcpdump", "-i", interface, "-s", "0", "--immediate-mode", "-U", "-w", str(path)]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # it reports "listening on ..." once attached
        assert self._process.stderr is not None and "listening on" in self._process.stderr.readline()

    def stop(self) -> pcap.Capture:
        if self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGINT)  # flushes and ends the file
            self._process.wait(10)
        return pcap.read(self.path)


@pytest.fixture
def capture(cluster: ClusterInfo, tmp_path: Path) -> Iterator[Tcpdump]:
    net = cluster.net()
    assert net is not None, "a cluster of several hosts"
    dump = Tcpdump(net.bridge, tmp_path / "bridge.pcap")
    try:
        yield dump
    finally:
        dump.stop()


def _record(cluster: ClusterInfo, role: str, index: int = 0) -> ProcessRecord:
    return [p for p in ClusterInfo.load(Path(cluster.dir)).processes if p.role == role][index]


def _restart(cluster: ClusterInfo, record: ProcessRecord) -> None:
    os.kill(record.pid, signal.SIGTERM)
    wait_until(lambda: not _record_named(cluster, record.name).running, 60, f"{record.name} to stop")
    restart(Path(cluster.dir), record.name, timeout=120.0)


def _record_named(cluster: ClusterInfo, name: str) -> ProcessRecord:
    return next(p for p in ClusterInfo.load(Path(cluster.dir)).processes if p.name == name)


def _kafka_round_trip(cluster: ClusterInfo, login: dict[str, str], value: bytes) -> None:
    """`value` written to a topic of its own and read back."""
    topic = f"capture-{os.urandom(4).hex()}"
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap, **login})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, **login})
    producer.produce(topic, value)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": topic,
                                         "auto.offset.reset": "earliest", **login})
    try:
        consumer.subscribe([topic])
        deadline, read = time.monotonic() + 30, list[bytes | None]()
        while not read and time.monotonic() < deadline:
            read = [m.value() for m in consumer.consume(1, timeout=1) if m.error() is None]
        assert read == [value]
    finally:
        consumer.close()
        admin.delete_topics([topic])[topic].result(30)


def test_a_capture_of_the_bridge_shows_no_plaintext(cluster: ClusterInfo, capture: Tcpdump) -> None:
    root = Path(cluster.dir)
    secret = (root / SECRET_FILE).read_text().strip()
    ca = str(root / CA_FILE)
    marker = b"plaintext-marker-" + os.urandom(8).hex().encode()
    data = marker * ((1 << 20) // len(marker))
    with Client(cluster.access_urls, ca=ca) as client:
        location = client.put(data)
        assert client.get(location) == data
    for role, index in (("clustermgr", 2), ("kafka", 0), ("access", 0)):
        _restart(cluster, _record(cluster, role, index))
    with Client(cluster.access_urls[:1], ca=ca) as client:  # the restarted access node: Redis, then blobnodes
        assert client.get(location) == data
    record = b"kafka-" + marker
    _kafka_round_trip(cluster, client_auth(kafka_user(secret, ADMIN, ca)), record)
    with redis.Redis.from_url(with_credentials(cluster.redis_url, secret), ssl_ca_certs=ca) as cache:
        cache.set(record.decode(), marker, ex=60)
        assert cache.get(record.decode()) == marker
    control = b"control-" + marker  # sent in clear: the capture sees what crosses the bridge
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(control, (cluster.access_urls[0].split("//")[1].split(":")[0], 9))
    time.sleep(1.0)
    seen = capture.stop()
    assert any(control in d for d in seen.datagrams), "the capture missed a datagram sent in clear"
    ports = pcap.by_port(seen)
    spec = load(root / SPEC_FILE)
    for link in ("access", "blobnode", "clustermgr", "clustermgr_raft", "kafka", "kafka_controller", "redis"):
        assert ports.get(getattr(spec.ports, link)), f"no {link} connection opened during the capture"
    plain = [f"{f.client} -> {f.server}: {bytes(f.sent[:16])!r}" for f in seen.flows
             if f.opened and f.sent and not f.sent.startswith(TLS_HANDSHAKE)]
    assert plain == [], "connections that did not start with TLS"
    secrets = {"object bytes": marker, "cluster secret": secret.encode(), "redis password": redis_password(
        secret).encode(), **{f"kafka password of {u}": p.encode() for u, p in scram_users(secret).items()}}
    for name, needle in secrets.items():
        found = [f"{f.client} -> {f.server}" for f in seen.flows if needle in f.sent or needle in f.answered]
        assert found == [], f"{name} in clear"
        assert not any(needle in d for d in seen.datagrams if d != control), f"{name} in clear (UDP)"
