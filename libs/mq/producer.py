"""An idempotent, acks=all Kafka producer whose `send` resolves only once the broker has the record."""

from __future__ import annotations

import asyncio
from typing import Any

from kafka import KafkaProducer
from kafka.producer.future import RecordMetadata


class Producer:
    """Async face over kafka-python's threaded producer.

    kafka-python batches on its own sender thread and resolves a future per record there; `send`
    parks the caller on an asyncio future completed from that thread, so the event loop never blocks
    and many concurrent sends share batches. Idempotence (with acks=all) means a retried batch is
    written once, so a broker restart during a send neither loses nor duplicates an acknowledged record.
    """

    def __init__(self, producer: KafkaProducer) -> None:
        self._producer = producer
        self._known_topics: set[str] = set()

    @classmethod
    async def connect(cls, bootstrap: str, **config: Any) -> Producer:
        """`config` overrides kafka-python settings, e.g. `linger_ms` or `client_id`."""
        settings: dict[str, Any] = {"bootstrap_servers": bootstrap, "enable_idempotence": True, "acks": "all",
                                    "linger_ms": 2, "client_id": "blobstore-producer", **config}
        return cls(await asyncio.to_thread(KafkaProducer, **settings))

    async def send(self, topic: str, key: bytes | None, value: bytes) -> tuple[int, int]:
        """Append one record; returns (partition, offset) once the broker acknowledged it."""
        if topic not in self._known_topics:
            # The first send to a topic blocks its caller until metadata arrives: do that off the loop.
            await asyncio.to_thread(self._producer.partitions_for, topic)
            self._known_topics.add(topic)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, int]] = loop.create_future()

        def ok(meta: RecordMetadata) -> None:
            loop.call_soon_threadsafe(_settle, done, (meta.partition, meta.offset), None)

        def failed(exc: BaseException) -> None:
            loop.call_soon_threadsafe(_settle, done, None, exc)

        self._producer.send(topic, key=key, value=value).add_callback(ok).add_errback(failed)
        return await done

    async def close(self, timeout: float = 10.0) -> None:
        """Flush what is buffered and stop the sender thread."""
        await asyncio.to_thread(self._producer.close, timeout)


def _settle(future: asyncio.Future[tuple[int, int]], result: tuple[int, int] | None,
            exc: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert result is not None
        future.set_result(result)
