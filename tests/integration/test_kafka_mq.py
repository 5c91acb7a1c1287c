"""libs/mq against a real Kafka broker: idempotent topics, acknowledged sends, at-least-once groups, restarts."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from blobstore_server.libs.mq.admin import ensure_topics, lag
from blobstore_server.libs.mq.consumer import Consumer, Record
from blobstore_server.libs.mq.offsets import OffsetTracker
from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.seal import Forged, message_key, unseal
from blobstore_server.libs.mq.topics import ALL_TOPICS
from blobstore_server.libs.rpc.auth import new_secret
from tests.support.kafka import KafkaBroker


def fresh_topic(bootstrap: str, partitions: int = 1) -> str:
    """A topic of this test alone, so tests sharing the session broker never see each other's records."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    ensure_topics(bootstrap, partitions, [name])
    return name


async def produce(bootstrap: str, topic: str, count: int) -> dict[bytes, tuple[int, int]]:
    producer = await Producer.connect(bootstrap)
    try:
        values = [f"m{i}".encode() for i in range(count)]
        acks = await asyncio.gather(*(producer.send(topic, str(i % 7).encode(), v) for i, v in enumerate(values)))
    finally:
        await producer.close()
    return dict(zip(values, acks, strict=True))


async def consume(consumer: Consumer, count: int, timeout: float = 30.0) -> list[Record]:
    """Poll until `count` records arrived (or fail after `timeout`)."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        assert time.monotonic() < deadline, f"only {len(records)} of {count} records arrived"
        records.extend(await consumer.poll(timeout=0.5))
    return records


def test_ensure_topics_is_idempotent(kafka_broker: KafkaBroker) -> None:
    ensure_topics(kafka_broker.bootstrap, 2)
    assert ensure_topics(kafka_broker.bootstrap, 2) == []
    lags = lag(kafka_broker.bootstrap, "nobody", ALL_TOPICS)
    assert set(lags) == set(ALL_TOPICS)
    name = f"test_{uuid.uuid4().hex[:12]}"
    assert ensure_topics(kafka_broker.bootstrap, 3, [name]) == [name]
    assert ensure_topics(kafka_broker.bootstrap, 3, [name]) == []
    assert lag(kafka_broker.bootstrap, "nobody", [name]) == {name: {0: 0, 1: 0, 2: 0}}


def test_every_acknowledged_message_is_consumed_once(kafka_broker: KafkaBroker) -> None:
    topic = fresh_topic(kafka_broker.bootstrap, partitions=3)
    count = 1000

    async def scenario() -> None:
        t0 = time.perf_counter()
        acks = await produce(kafka_broker.bootstrap, topic, count)
        produced = time.perf_counter() - t0
        assert len(set(acks.values())) == count  # every record got its own (partition, offset)
        consumer = await Consumer.connect(kafka_broker.bootstrap, "g-all", [topic])
        try:
            records = await consume(consumer, count)
            assert sorted(r.value for r in records) == sorted(acks)
            assert {r.value: (r.partition, r.offset) for r in records} == acks
            tracker = OffsetTracker()
            for r in records:
                tracker.add(r.tp, r.offset)
                tracker.done(r.tp, r.offset)
            assert await consumer.commit(tracker.committable())
        finally:
            await consumer.close()
        print(f"{count} acked sends in {produced:.2f}s ({count / produced:.0f}/s)")

    asyncio.run(scenario())
    assert lag(kafka_broker.bootstrap, "g-all", [topic]) == {topic: {0: 0, 1: 0, 2: 0}}


def test_uncommitted_messages_come_back_after_a_consumer_restart(kafka_broker: KafkaBroker) -> None:
    topic = fresh_topic(kafka_broker.bootstrap)

    async def scenario() -> None:
        await produce(kafka_broker.bootstrap, topic, 20)
        first = await Consumer.connect(kafka_broker.bootstrap, "g-restart", [topic])
        tracker = OffsetTracker()
        try:
            records = await consume(first, 20)
            for r in records:
                tracker.add(r.tp, r.offset)
            for r in records:
                if r.offset != 5:  # offset 5's work never finishes before this consumer dies
                    tracker.done(r.tp, r.offset)
            assert tracker.committable() == {(topic, 0): 5}
            assert await first.commit(tracker.committable())
        finally:
            await first.close()
        second = await Consumer.connect(kafka_broker.bootstrap, "g-restart", [topic])
        try:
            again = await consume(second, 15)
            assert [r.offset for r in again] == list(range(5, 20))
        finally:
            await second.close()

    asyncio.run(scenario())
    assert lag(kafka_broker.bootstrap, "g-restart", [topic]) == {topic: {0: 15}}


def test_broker_restart_mid_stream_loses_no_acknowledged_message(kafka_broker: KafkaBroker) -> None:
    topic = fresh_topic(kafka_broker.bootstrap, partitions=2)
    count = 300

    async def scenario() -> None:
        producer = await Producer.connect(kafka_broker.bootstrap)
        acked: list[bytes] = []
        failed: list[BaseException] = []

        async def send(i: int) -> None:
            value = f"r{i}".encode()
            try:
                await producer.send(topic, None, value)
                acked.append(value)
            except Exception as exc:  # a send may fail; only what was acknowledged is promised
                failed.append(exc)

        async def stream() -> None:
            for i in range(count):
                await send(i)
                await asyncio.sleep(0.002)

        streaming = asyncio.create_task(stream())
        while len(acked) < count // 4:
            await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        await asyncio.to_thread(kafka_broker.restart)
        t1 = time.perf_counter()
        assert len(acked) < count, "the stream must still be running when the broker is back"
        await streaming
        print(f"broker restart {t1 - t0:.2f}s, stream done {time.perf_counter() - t1:.2f}s later")
        await producer.close()
        assert len(acked) + len(failed) == count
        assert len(acked) > count // 2, failed[:3]
        consumer = await Consumer.connect(kafka_broker.bootstrap, "g-broker-restart", [topic])
        try:
            records = await consume(consumer, len(acked))
            values = [r.value for r in records]
            assert set(acked) <= set(values)
            assert len(values) == len(set(values)), "the idempotent producer wrote a record twice"
        finally:
            await consumer.close()

    asyncio.run(scenario())


def test_lag_counts_what_the_group_has_not_committed(kafka_broker: KafkaBroker) -> None:
    topic = fresh_topic(kafka_broker.bootstrap, partitions=2)

    async def scenario() -> None:
        acks = await produce(kafka_broker.bootstrap, topic, 10)
        per_partition = {p: sum(1 for part, _ in acks.values() if part == p) for p in (0, 1)}
        assert lag(kafka_broker.bootstrap, "g-lag", [topic]) == {topic: per_partition}
        consumer = await Consumer.connect(kafka_broker.bootstrap, "g-lag", [topic])
        try:
            records = await consume(consumer, 10)
            first = next(r for r in records if r.partition == 0)
            assert await consumer.commit({first.tp: first.offset + 1})
        finally:
            await consumer.close()
        assert lag(kafka_broker.bootstrap, "g-lag", [topic]) == {topic: {0: per_partition[0] - 1, 1: per_partition[1]}}

    asyncio.run(scenario())


def test_groups_joining_at_once_in_one_process_all_consume_and_then_idle(kafka_broker: KafkaBroker) -> None:
    """tinker runs four groups from one process: each gets its partitions and idles quietly. (kafka-python 3.0.12,
    used before, was seen in tinker to leave one half-joined at start, never assigned, its poll loop taking a core.)"""
    run = uuid.uuid4().hex[:8]
    topics = [f"test_{run}_{i}" for i in range(4)]

    async def scenario() -> None:
        # As at a cluster's first start: the topics are created while the groups join.
        creating = asyncio.create_task(asyncio.to_thread(ensure_topics, kafka_broker.bootstrap, 2, topics))
        consumers = await asyncio.gather(*(Consumer.connect(kafka_broker.bootstrap, f"g-{run}-{i}", [topic])
                                           for i, topic in enumerate(topics)))
        await creating
        try:
            await asyncio.gather(*(produce(kafka_broker.bootstrap, topic, 10) for topic in topics))
            received = await asyncio.gather(*(consume(consumer, 10, timeout=20) for consumer in consumers))
            assert [len(records) for records in received] == [10] * 4
            cpu, wall = time.process_time(), time.monotonic()
            for _ in range(10):
                assert not any(await asyncio.gather(*(consumer.poll(timeout=0.3) for consumer in consumers)))
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            assert cpu < 0.25 * wall, f"{cpu:.2f} s of CPU in {wall:.2f} s of idle polls by four consumers"
        finally:
            await asyncio.gather(*(consumer.close() for consumer in consumers))

    asyncio.run(scenario())


def test_a_sealing_producers_records_reach_the_consumer_verifiable(kafka_broker: KafkaBroker) -> None:
    """The seal travels in a header through the broker (tinker re-publishes failed messages this way); the
    value stays the plain bytes, and an unsealing producer's record comes with no seal."""
    topic = fresh_topic(kafka_broker.bootstrap)
    key = message_key(new_secret())

    async def scenario() -> list[Record]:
        sealing = await Producer.connect(kafka_broker.bootstrap, seal_key=key)
        plain = await Producer.connect(kafka_broker.bootstrap)
        try:
            await sealing.send(topic, b"k", b'{"sealed": true}')
            await plain.send(topic, b"k", b'{"sealed": false}')
        finally:
            await sealing.close()
            await plain.close()
        consumer = await Consumer.connect(kafka_broker.bootstrap, f"g-{topic}", [topic])
        try:
            return sorted(await consume(consumer, 2), key=lambda r: r.offset)
        finally:
            await consumer.close()

    sealed, plain = asyncio.run(scenario())
    assert unseal(key, topic, sealed.value, sealed.headers) == b'{"sealed": true}'
    assert plain.headers == ()
    with pytest.raises(Forged, match="no seal"):
        unseal(key, topic, plain.value, plain.headers)
