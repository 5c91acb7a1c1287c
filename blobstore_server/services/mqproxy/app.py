"""mqproxy HTTP routes: repair and delete messages in, Kafka records out, answered once acknowledged."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI

from blobstore_server.libs.mq.admin import ensure_topics
from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.topics import Topic
from blobstore_server.libs.proto import mqproxy as api
from blobstore_server.libs.proto.messages import BlobMsg, DeleteMsg, RepairMsg
from blobstore_server.libs.proto.mqproxy import DeleteBatch, PublisherStats, Queued, RepairBatch
from blobstore_server.libs.rpc.errors import Unavailable
from blobstore_server.libs.rpc.server import Lifecycle, create_app, serves


class Publisher:
    """Sends messages and counts them; the producer is connected when the app starts."""

    def __init__(self, bootstrap: str, partitions: int, cluster_id: int, confirm_timeout: float) -> None:
        self.cluster_id = cluster_id
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.confirm_timeout = confirm_timeout
        self.producer: Producer | None = None
        self.stats = PublisherStats()

    async def connect(self) -> None:
        """Create missing topics, then connect the producer (the app's start hook)."""
        await asyncio.to_thread(ensure_topics, self.bootstrap, self.partitions)
        self.producer = await Producer.connect(self.bootstrap, client_id="mqproxy")

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.close()

    async def publish(self, items: list[tuple[Topic, BlobMsg]]) -> int:
        if self.producer is None:
            raise Unavailable("mqproxy is not connected to Kafka yet")
        self.stats.messages_in += len(items)
        try:
            async with asyncio.timeout(self.confirm_timeout):
                await asyncio.gather(*(self.producer.send(topic, msg.key(), msg.to_bytes()) for topic, msg in items))
        except TimeoutError:
            self.stats.unconfirmed += len(items)
            raise Unavailable(f"Kafka did not confirm {len(items)} message(s) within {self.confirm_timeout} s; "
                              "they may still be delivered") from None
        except Exception as exc:  # librdkafka's KafkaException, or a delivery timeout
            self.stats.failed += len(items)
            raise Unavailable(f"Kafka did not take the messages: {type(exc).__name__}: {exc}") from exc
        for topic, _ in items:
            self.stats.sent[topic] = self.stats.sent.get(topic, 0) + 1
        return len(items)


def build_app(publisher: Publisher, life: Lifecycle) -> FastAPI:
    async def start() -> None:
        await publisher.connect()
        await life.start()

    app = create_app("mqproxy", on_start=start, on_stop=life.stop)

    @serves(app, api.REPAIR)
    async def repair(batch: RepairBatch) -> Queued:
        items: list[tuple[Topic, BlobMsg]] = [
            (Topic.SHARD_REPAIR_PRIOR if m.priority else Topic.SHARD_REPAIR,
             RepairMsg(cluster_id=publisher.cluster_id, vid=m.vid, bid=m.bid, bad_indexes=m.bad_indexes,
                       reason=m.reason))
            for m in batch.messages]
        return Queued(queued=await publisher.publish(items))

    @serves(app, api.DELETE)
    async def delete(batch: DeleteBatch) -> Queued:
        now = time.time()
        items: list[tuple[Topic, BlobMsg]] = [
            (Topic.UPLOAD_RECLAIM if m.upload else Topic.BLOB_DELETE,
             DeleteMsg(cluster_id=publisher.cluster_id, vid=m.vid, bid=m.bid, time=now + m.after,
                       not_before=now + m.after, upload=tuple(m.upload), intent=m.intent))
            for m in batch.messages]
        return Queued(queued=await publisher.publish(items))

    @serves(app, api.STATS)
    async def stats() -> PublisherStats:
        return publisher.stats

    return app
