"""One real Kafka broker per test session, started and stopped by PID (blobstore_server/cluster/kafka_broker.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from blobstore_server.cluster import kafka_broker as broker
from tests.support.processes import free_port


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

