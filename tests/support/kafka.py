"""One real Kafka broker per test session, started and stopped by PID through deploy/kafka/broker.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from deploy.kafka import broker
from libs.mq.admin import ensure_topics
from libs.mq.topics import ALL_TOPICS
from tests.support.processes import free_port, wait_until


@dataclass
class KafkaBroker:
    """A broker on fixed ports and a fixed data dir, so a restart keeps topics, records and offsets."""

    directory: Path
    port: int
    controller_port: int
    pid: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> KafkaBroker:
        self.pid, _ = broker.start(self.directory, self.port, self.controller_port)
        return self

    def stop(self) -> None:
        broker.stop(self.directory)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Fetches the jars on a fresh machine (once), then runs one broker for the whole session."""
    broker.fetch()
    kafka = KafkaBroker(tmp_path_factory.mktemp("kafka"), free_port(), free_port())
    try:
        yield kafka.start()
    finally:
        kafka.stop()


def fresh_topics(bootstrap: str, partitions: int) -> None:
    """Delete and recreate every blobstore topic, so a test's cluster never sees messages another
    test's cluster left behind (vids and bids repeat across clusters). Committed group offsets of a
    deleted topic go with it."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-reset")
    try:
        names = [str(t) for t in ALL_TOPICS]
        present = [t for t in names if t in set(admin.list_topics())]
        if present:
            admin.delete_topics(present)
            wait_until(lambda: not set(present) & set(admin.list_topics()), 30, "topics deleted")
    finally:
        admin.close()
    wait_until(lambda: _created(bootstrap, partitions), 30, "topics recreated")


def _created(bootstrap: str, partitions: int) -> bool:
    try:
        ensure_topics(bootstrap, partitions)
    except KafkaError:
        return False  # the broker may still be finishing the deletion
    return True
