"""A consumer-group member with manual commits: a message counts as consumed only when its work is done."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import confluent_kafka
from confluent_kafka import KafkaException

from blobstore_server.libs.mq import settings as shared
from blobstore_server.libs.mq.offsets import TopicPartition as TP

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()  # e.g. the producer's seal (libs/mq/seal.py)

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


def _headers(raw: list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None
             ) -> tuple[tuple[str, bytes], ...]:
    """A consumed record's headers (librdkafka gives a list, or None) as (name, bytes) pairs."""
    pairs = raw.items() if isinstance(raw, dict) else raw or ()
    return tuple((name, value.encode() if isinstance(value, str) else value or b"") for name, value in pairs)


class Consumer:
    """Async face over librdkafka's consumer (confluent-kafka).

    Every call runs on one dedicated thread, so a commit issued while the next poll is in flight waits
    for it instead of racing it, and the event loop never blocks. librdkafka keeps the group membership
    (heartbeats, rebalances) on its own threads; kafka-python 3.0, used before, was seen to leave a member
    half-joined or out of its group for good, polling in a tight loop.
    """

    def __init__(self, consumer: confluent_kafka.Consumer, executor: ThreadPoolExecutor) -> None:
        self._consumer = consumer
        self._executor = executor
        self._paused = False

    @classmethod
    async def connect(cls, bootstrap: str, group: str, topics: Iterable[str], **config: Any) -> Consumer:
        """Join `group` on `topics`; a partition the group never committed is read from its start.
        `config` overrides librdkafka settings by name."""
        settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                    "auto.offset.reset": "earliest", "client.id": f"blobstore-{group}",
                                    # A topic created after we subscribed (or re-created) is noticed at the
                                    # next metadata refresh: every 5 s, not librdkafka's default 5 min.
                                    "topic.metadata.refresh.interval.ms": 5000,
                                    # A member killed without leaving keeps its partitions until its session
                                    # lapses, so no message of theirs moves meanwhile: 10 s (Kafka's default
                                    # before 3.0; the broker's floor is 6 s), not librdkafka's 45 s.
                                    "session.timeout.ms": 10_000,
                                    # A fetch the broker holds until a record arrives (or this long): a longer
                                    # wait adds no latency, only fewer empty round trips while idle (default 500).
                                    "fetch.wait.max.ms": 2000, **shared.SHARED, **config}
        names = [str(t) for t in topics]

        def subscribed() -> confluent_kafka.Consumer:
            consumer = confluent_kafka.Consumer(settings)
            consumer.subscribe(names)
            return consumer

        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kafka-consumer-{group}")
        return cls(await asyncio.get_running_loop().run_in_executor(executor, subscribed), executor)

    async def _run(self, call: partial[T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def poll(self, timeout: float = 0.5, max_records: int = 500, *, paused: bool = False) -> list[Record]:
        """The next batch (possibly empty after `timeout`), in offset order within each partition.

        `paused` fetches nothing new while the consumer stays in its group: the messages wait in Kafka. It
        is applied on every call because a rebalance hands out partitions unpaused; a partition assigned
        during this very call may still deliver a batch, which the caller must hold back itself.
        """
        def fetch() -> list[confluent_kafka.Message]:
            if paused or self._paused:
                assigned = self._consumer.assignment()
                if assigned:
                    (self._consumer.pause if paused else self._consumer.resume)(assigned)
                self._paused = paused
            # consume(n, timeout) waits out the whole timeout unless n records come: wait for the first one only,
            # then take what else is already fetched
            first = self._consumer.consume(num_messages=1, timeout=timeout)
            if not first or max_records == 1:
                return first
            return first + self._consumer.consume(num_messages=max_records - 1, timeout=0)

        records = []
        for message in await self._run(partial(fetch)):
            error = message.error()
            if error is not None:  # e.g. a subscribed topic that does not exist yet; librdkafka retries
                log.warning("kafka consumer: %s", error)
                continue
            records.append(Record(str(message.topic()), int(message.partition() or 0), int(message.offset() or 0),
                                  message.key(), message.value() or b"", message.timestamp()[1],
                                  _headers(message.headers())))
        return records

    async def commit(self, offsets: Mapping[TP, int]) -> bool:
        """Commit `{(topic, partition): next offset to read}`.

        False when the group rebalanced meanwhile: the new owner of those partitions gets the
        uncommitted messages again, which at-least-once delivery allows.
        """
        if not offsets:
            return True
        parts = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in offsets.items()]

        def commit() -> bool:
            # A synchronous commit returns each partition with its own error (the stubs say None).
            answer: list[confluent_kafka.TopicPartition] | None = self._consumer.commit(  # type: ignore[func-returns-value]
                offsets=parts, asynchronous=False)
            return not any(part.error is not None for part in answer or [])

        try:
            return await self._run(partial(commit))
        except KafkaException as exc:
            log.info("kafka consumer: commit refused: %s", exc)
            return False

    async def close(self) -> None:
        """Leave the group at once (no session timeout wait for the others), without committing."""
        try:
            await self._run(partial(self._consumer.close))
        finally:
            self._executor.shutdown(wait=False)
