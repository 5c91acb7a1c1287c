"""Topic creation and consumer-lag reporting (blocking calls: from async code use asyncio.to_thread)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, TypeVar

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from blobstore_server.libs.mq.offsets import TopicPartition as TP
from blobstore_server.libs.mq.topics import ALL_TOPICS

T = TypeVar("T")
# Answers while a group's coordinator or a new partition's leader settles (librdkafka flags not all retriable).
SETTLING = frozenset({KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
                      KafkaError.NOT_COORDINATOR, KafkaError.NOT_LEADER_FOR_PARTITION,
                      KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART})


NO_SETTINGS: Mapping[str, Any] = {}


def _admin(bootstrap: str, client: Mapping[str, Any] = NO_SETTINGS) -> AdminClient:
    """`client`: further librdkafka settings, e.g. libs/mq/settings.client_auth's login."""
    return AdminClient({"bootstrap.servers": bootstrap, "client.id": "blobstore-admin", **client})


def _settled(call: Callable[[], T], timeout: float) -> T:
    """`call()`, again while Kafka answers that what it asks about is still settling, until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in SETTLING) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _metadata(admin: AdminClient, timeout: float) -> ClusterMetadata:
    return admin.list_topics(timeout=timeout)


def ensure_topics(bootstrap: str, partitions: int, topics: Iterable[str] = ALL_TOPICS,
                  timeout: float = 30.0, client: Mapping[str, Any] = NO_SETTINGS) -> list[str]:
    """Create the topics that do not exist yet and wait until each has a leader for every partition;
    returns the names created. Safe to call from every process (the replication factor is the broker's)."""
    wanted = [str(t) for t in topics]
    admin = _admin(bootstrap, client)
    missing = [t for t in wanted if t not in _metadata(admin, timeout).topics]
    if missing:
        for future in admin.create_topics([NewTopic(t, partitions) for t in missing]).values():
            try:
                future.result()
            except KafkaException as exc:  # another process may win the race for some of them
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    deadline = time.monotonic() + timeout
    while not _all_led(_metadata(admin, timeout), wanted):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {wanted} have no leader for every partition after {timeout} s")
        time.sleep(0.1)
    return missing


def _all_led(metadata: ClusterMetadata, topics: list[str]) -> bool:
    for name in topics:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            return False
        if any(p.leader < 0 for p in topic.partitions.values()):
            return False
    return True


class LagReader:
    """Where consumer groups stand, read through one consumer per group that never joins it, kept open between
    reads: a reader opened per read cost a connection and a login each time (the dashboard and tinker read
    every few seconds; tests ask tinker far more often).

    A consumer rather than the admin API: librdkafka's admin call for a group's offsets crashes the process
    (SIGSEGV in rd_kafka_cgrp_op) when the group's coordinator is not known yet, as at a cluster's first start
    (confluent-kafka-javascript#374 has the same trace). Safe to share between threads.
    """

    def __init__(self, bootstrap: str, timeout: float = 10.0, client: Mapping[str, Any] = NO_SETTINGS) -> None:
        self.bootstrap, self.timeout, self.client = bootstrap, timeout, client
        self._readers: dict[str, tuple[threading.Lock, confluent_kafka.Consumer]] = {}
        self._lock = threading.Lock()

    def _reader(self, group: str) -> tuple[threading.Lock, confluent_kafka.Consumer]:
        with self._lock:
            if group not in self._readers:
                self._readers[group] = (threading.Lock(), confluent_kafka.Consumer({
                    "bootstrap.servers": self.bootstrap, "group.id": group, "client.id": "blobstore-lag",
                    "enable.auto.commit": False, **self.client}))
            return self._readers[group]

    def positions(self, group: str, topics: Iterable[str]) -> dict[TP, tuple[int, int]]:
        """Per existing partition of `topics`: (where `group` resumes, the end offset). A partition the group never
        committed resumes at its earliest retained offset, so the messages between the two are not consumed yet."""
        lock, reader = self._reader(group)
        timeout = self.timeout
        with lock:
            known = reader.list_topics(timeout=timeout).topics
            parts = [TopicPartition(str(t), p) for t in topics if str(t) in known
                     for p in sorted(known[str(t)].partitions)]
            committed = _settled(lambda: reader.committed(parts, timeout=timeout), timeout) if parts else []
            result: dict[TP, tuple[int, int]] = {}
            for part in committed:
                low, high = _settled(partial(reader.get_watermark_offsets, part, timeout=timeout), timeout)
                result[(part.topic, part.partition)] = (part.offset if part.offset >= 0 else low, high)
            return result

    def lag(self, group: str, topics: Iterable[str]) -> dict[str, dict[int, int]]:
        """Messages not yet committed by `group`, per topic and partition."""
        result: dict[str, dict[int, int]] = {}
        for (topic, partition), (position, end) in self.positions(group, topics).items():
            result.setdefault(topic, {})[partition] = max(0, end - position)
        return result

    def close(self) -> None:
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
        for lock, reader in readers:
            with lock:
                reader.close()


def positions(bootstrap: str, group: str, topics: Iterable[str], timeout: float = 10.0,
              client: Mapping[str, Any] = NO_SETTINGS) -> dict[TP, tuple[int, int]]:
    """`LagReader.positions` once."""
    with contextlib.closing(LagReader(bootstrap, timeout, client)) as reader:
        return reader.positions(group, topics)


def lag(bootstrap: str, group: str, topics: Iterable[str], timeout: float = 10.0,
        client: Mapping[str, Any] = NO_SETTINGS) -> dict[str, dict[int, int]]:
    """`LagReader.lag` once."""
    with contextlib.closing(LagReader(bootstrap, timeout, client)) as reader:
        return reader.lag(group, topics)
