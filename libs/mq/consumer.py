"""A consumer-group member with manual commits: a message counts as consumed only when its work is done."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from libs.mq.offsets import TopicPartition as TP

T = TypeVar("T")
FETCH_WAIT_MS = 100  # the longest the broker holds a fetch for data to arrive; polls must not be shorter


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


class Consumer:
    """Async face over kafka-python's KafkaConsumer, which is not thread-safe.

    Every call runs on one dedicated thread, so a commit issued while the next poll is in flight waits
    for it instead of racing it, and the event loop never blocks.
    """

    def __init__(self, consumer: KafkaConsumer, executor: ThreadPoolExecutor) -> None:
        self._consumer = consumer
        self._executor = executor

    @classmethod
    async def connect(cls, bootstrap: str, group: str, topics: Iterable[str], **config: Any) -> Consumer:
        """Join `group` on `topics`; a partition the group never committed is read from its start."""
        settings: dict[str, Any] = {"bootstrap_servers": bootstrap, "group_id": group, "enable_auto_commit": False,
                                    "auto_offset_reset": "earliest", "client_id": f"blobstore-{group}",
                                    # A topic created after we subscribed (or re-created) is noticed at the
                                    # next metadata refresh: every 5 s, not kafka-python's default 5 min.
                                    "metadata_max_age_ms": 5000,
                                    # Shorter than any poll's timeout: kafka-python 3.0 spins while a poll ends
                                    # before the broker answers its fetch (two consumers in one process polling
                                    # every 0.2 s with the default 500 ms wait took 90% of a core, idle).
                                    "fetch_max_wait_ms": FETCH_WAIT_MS, **config}
        names = [str(t) for t in topics]

        def subscribed() -> KafkaConsumer:
            # Know every topic's partitions before joining: a first join without them assigns nothing, and
            # the rejoin that follows was seen to hang in kafka-python 3.0 when several groups joined at once.
            consumer = KafkaConsumer(**settings)
            for name in names:
                consumer.partitions_for_topic(name)
            consumer.subscribe(names)
            return consumer

        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kafka-consumer-{group}")
        return cls(await asyncio.get_running_loop().run_in_executor(executor, subscribed), executor)

    async def _run(self, call: partial[T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def poll(self, timeout: float = 0.5, max_records: int = 500, *, paused: bool = False) -> list[Record]:
        """The next batch (possibly empty after `timeout`, at least FETCH_WAIT_MS), in offset order within each
        partition.

        `paused` fetches nothing new while the consumer stays in its group: the messages wait in Kafka. It
        is applied on every call because a rebalance hands out partitions unpaused; a partition assigned
        during this very call may still deliver a batch, which the caller must hold back itself.
        """
        def fetch() -> Any:
            if paused:
                self._consumer.pause(*self._consumer.assignment())
            elif self._consumer.paused():
                self._consumer.resume(*self._consumer.paused())
            return self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)

        batches = await self._run(partial(fetch))
        return [Record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
                for records in batches.values() for m in records]

    async def commit(self, offsets: Mapping[TP, int]) -> bool:
        """Commit `{(topic, partition): next offset to read}`.

        False when the group rebalanced meanwhile: the new owner of those partitions gets the
        uncommitted messages again, which at-least-once delivery allows.
        """
        if not offsets:
            return True
        kafka_offsets = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        try:
            await self._run(partial(self._consumer.commit, kafka_offsets))
        except (CommitFailedError, RebalanceInProgressError):  # kafka-python 3 raises the latter mid-rebalance
            # kafka-python 3.0.12 was seen (tinker, three brokers) to leave a member "not part of an active group"
            # without ever rejoining: every commit failed for minutes. Ask for the rejoin the next poll performs.
            self._consumer._coordinator.request_rejoin()
            return False
        return True

    async def close(self) -> None:
        """Leave the group at once (no session timeout wait for the others), without committing."""
        try:
            await self._run(partial(self._consumer.close, autocommit=False))
        finally:
            self._executor.shutdown(wait=False)
