"""mqproxy HTTP routes: repair and delete messages in, Kafka records out, answered once acknowledged."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from libs.mq.admin import ensure_topics
from libs.mq.producer import Producer
from libs.mq.topics import Topic
from libs.proto.messages import BlobMsg, DeleteMsg, RepairMsg
from libs.rpc.errors import Unavailable
from libs.rpc.server import Lifecycle, create_app

MAX_BATCH = 10_000


class RepairIn(BaseModel):
    vid: int = Field(ge=1, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)
    bad_indexes: list[int] = Field(min_length=1)
    reason: str = ""
    priority: bool = False


class DeleteIn(BaseModel):
    vid: int = Field(ge=1, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)


class RepairBatch(BaseModel):
    messages: list[RepairIn] = Field(min_length=1, max_length=MAX_BATCH)


class DeleteBatch(BaseModel):
    messages: list[DeleteIn] = Field(min_length=1, max_length=MAX_BATCH)


class Publisher:
    """Sends messages and counts them; the producer is connected when the app starts."""

    def __init__(self, bootstrap: str, partitions: int, cluster_id: int) -> None:
        self.cluster_id = cluster_id
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.producer: Producer | None = None
        self.stats: Counter[str] = Counter()

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
        self.stats["messages_in"] += len(items)
        try:
            await asyncio.gather(*(self.producer.send(topic, msg.key(), msg.to_bytes()) for topic, msg in items))
        except Exception as exc:  # kafka-python raises its own KafkaError family
            self.stats["failed"] += len(items)
            raise Unavailable(f"Kafka did not take the messages: {type(exc).__name__}: {exc}") from exc
        for topic, _ in items:
            self.stats[f"sent_{topic}"] += 1
        return len(items)


def build_app(publisher: Publisher, life: Lifecycle) -> FastAPI:
    async def start() -> None:
        await publisher.connect()
        await life.start()

    app = create_app("mqproxy", on_start=start, on_stop=life.stop)

    @app.post("/repairmsg")
    async def repair(batch: RepairBatch) -> dict[str, int]:
        items: list[tuple[Topic, BlobMsg]] = [
            (Topic.SHARD_REPAIR_PRIOR if m.priority else Topic.SHARD_REPAIR,
             RepairMsg(cluster_id=publisher.cluster_id, vid=m.vid, bid=m.bid, bad_indexes=m.bad_indexes,
                       reason=m.reason))
            for m in batch.messages]
        return {"queued": await publisher.publish(items)}

    @app.post("/deletemsg")
    async def delete(batch: DeleteBatch) -> dict[str, int]:
        now = time.time()
        items: list[tuple[Topic, BlobMsg]] = [
            (Topic.BLOB_DELETE, DeleteMsg(cluster_id=publisher.cluster_id, vid=m.vid, bid=m.bid, time=now))
            for m in batch.messages]
        return {"queued": await publisher.publish(items)}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return dict(publisher.stats)

    return app
