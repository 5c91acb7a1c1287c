"""An idempotent, acks=all Kafka producer whose `send` resolves only once the broker has the record."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, Message

from blobstore_server.libs.mq import settings
from blobstore_server.libs.mq.seal import seal_headers

DELIVERY_TIMEOUT_MS = 120_000  # a send not acknowledged by then fails (the broker was unreachable all along)
# poll() returns as soon as it served a report: the wait only bounds how long `close` waits for the thread
REPORT_WAIT = 0.5


class Producer:
    """Async face over librdkafka's producer (confluent-kafka).

    librdkafka batches and retries on its own threads; delivery reports are served by one thread of ours,
    which completes an asyncio future per record, so the event loop never blocks and many concurrent sends
    share batches. Idempotence (with acks=all) means a retried batch is written once, so a broker restart
    during a send neither loses nor duplicates an acknowledged record.

    With a `seal_key` every record carries a seal (libs/mq/seal.py), so the one place that produces also seals:
    no caller can forget it.
    """

    def __init__(self, producer: confluent_kafka.Producer, seal_key: bytes | None = None) -> None:
        self._producer = producer
        self.seal_key = seal_key
        self._closing = threading.Event()
        self._reports = threading.Thread(target=self._serve_reports, name="kafka-delivery-reports", daemon=True)
        self._reports.start()

    @classmethod
    async def connect(cls, bootstrap: str, client_id: str = "blobstore-producer", *, seal_key: bytes | None = None,
                      **config: Any) -> Producer:
        """`config` overrides librdkafka settings by name, e.g. `{"linger.ms": 5}`; `seal_key` seals every record."""
        options: dict[str, Any] = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 2, "client.id": client_id,
                                   "message.timeout.ms": DELIVERY_TIMEOUT_MS, **settings.SHARED, **config}
        return cls(await asyncio.to_thread(confluent_kafka.Producer, options), seal_key)

    def _serve_reports(self) -> None:
        while not self._closing.is_set():
            self._producer.poll(REPORT_WAIT)

    async def send(self, topic: str, key: bytes | None, value: bytes) -> tuple[int, int]:
        """Append one record; returns (partition, offset) once the broker acknowledged it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, int]] = loop.create_future()

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                loop.call_soon_threadsafe(_settle, done, None, KafkaException(error))
            else:
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None  # a delivered record has both
                loop.call_soon_threadsafe(_settle, done, (partition, offset), None)

        while True:
            try:
                if self.seal_key is None:
                    self._producer.produce(topic, value=value, key=key, on_delivery=delivered)
                else:
                    self._producer.produce(topic, value=value, key=key, on_delivery=delivered,
                                           headers=seal_headers(self.seal_key, topic, value))
                break
            except BufferError:  # librdkafka's local queue is full: wait for deliveries to make room
                await asyncio.sleep(0.01)
        return await done

    async def close(self, timeout: float = 10.0) -> None:
        """Deliver what is buffered (for up to `timeout`; the rest fails), stop serving reports, then end
        librdkafka's client: left to the garbage collector, its threads would go on reconnecting to the brokers."""
        await asyncio.to_thread(self._producer.flush, timeout)
        self._producer.purge()
        await asyncio.to_thread(self._producer.flush, 0)  # serve the purged records' reports: their sends fail
        self._closing.set()
        await asyncio.to_thread(self._reports.join)
        await asyncio.to_thread(self._producer.close)


def _settle(future: asyncio.Future[tuple[int, int]], result: tuple[int, int] | None,
            exc: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert result is not None
        future.set_result(result)
