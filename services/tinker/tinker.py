"""tinker: the repair and delete pipelines, wired to their handlers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from libs.mq.admin import lag
from libs.mq.consumer import Consumer, Record
from libs.mq.producer import Producer
from libs.mq.topics import Topic
from libs.proto.messages import DeleteMsg, RepairMsg
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from services.tinker.config import TinkerConfig
from services.tinker.handlers import DeleteHandler, RepairHandler
from services.tinker.pipeline import Pipeline, sleep_until
from services.tinker.rules import RetryPolicy
from services.worker.client import WorkerClient

log = logging.getLogger(__name__)
PRIORITY_POLL = 0.02
# Each pipeline: its name and topics; its consumer group is "<group_prefix>-<name>". Priority repairs
# have a group of their own so a backlog of ordinary repairs never stands in front of them.
PIPELINE_TOPICS: dict[str, tuple[Topic, ...]] = {
    "repair_prior": (Topic.SHARD_REPAIR_PRIOR,),
    "repair": (Topic.SHARD_REPAIR, Topic.SHARD_REPAIR_FAILED),
    "delete": (Topic.BLOB_DELETE, Topic.BLOB_DELETE_FAILED),
}


def pipelines(group_prefix: str) -> list[tuple[str, str, tuple[Topic, ...]]]:
    """(name, consumer group, topics) of every pipeline."""
    return [(name, f"{group_prefix}-{name.replace('_', '-')}", topics) for name, topics in PIPELINE_TOPICS.items()]


class Tinker:
    def __init__(self, config: TinkerConfig) -> None:
        self.config = config
        self.policy = RetryPolicy(config.retry_base, config.retry_cap)
        self.cluster = ClusterClient(config.clustermgr_hosts)
        self.blobnodes = BlobnodeClient()
        self.workers = WorkerClient()
        self.repair = RepairHandler(self.cluster, self.workers)
        self.delete = DeleteHandler(self.cluster, self.blobnodes, Path(config.delete_log))
        self.pipelines: dict[str, Pipeline] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._producer: Producer | None = None

    async def start(self) -> None:
        bootstrap = self.config.kafka_bootstrap
        self._producer = await Producer.connect(bootstrap, client_id="tinker")
        repair_slots = asyncio.Semaphore(self.config.concurrency)  # shared by both repair pipelines
        for name, group, topics in pipelines(self.config.group_prefix):
            consumer = await Consumer.connect(bootstrap, group, topics)
            handle = self._on_delete if name == "delete" else functools.partial(self._on_repair, name)
            slots = asyncio.Semaphore(self.config.concurrency) if name == "delete" else repair_slots
            pipeline = Pipeline(name, consumer, self._producer, handle, slots=slots,
                                commit_interval=self.config.commit_interval)
            self.pipelines[name] = pipeline
            self._tasks.append(asyncio.create_task(pipeline.run()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for pipeline in self.pipelines.values():
            await pipeline.consumer.close()
        if self._producer is not None:
            await self._producer.close()
        for client in (self.cluster, self.blobnodes, self.workers):
            await client.close()

    async def _on_repair(self, name: str, record: Record) -> None:
        pipeline = self.pipelines[name]
        msg = self._parse(RepairMsg, record)
        if msg is None:
            return
        await sleep_until(msg.not_before)
        async with self._repair_slot(pipeline):
            try:
                await self.repair(msg)
                pipeline.stats["done"] += 1
            except Exception as exc:
                await pipeline.hand_on(Topic.SHARD_REPAIR_FAILED, msg, self.policy, f"{type(exc).__name__}: {exc}")

    @contextlib.asynccontextmanager
    async def _repair_slot(self, pipeline: Pipeline) -> AsyncIterator[None]:
        """A repair slot; an ordinary repair that gets one while a priority repair is pending gives
        it back and waits (checked after acquiring, so queued ordinary repairs cannot jump ahead)."""
        prior = self.pipelines["repair_prior"]
        while True:
            await pipeline.slots.acquire()
            if pipeline is prior or not prior.tracker.pending():
                break
            pipeline.slots.release()
            await asyncio.sleep(PRIORITY_POLL)
        try:
            yield
        finally:
            pipeline.slots.release()

    async def _on_delete(self, record: Record) -> None:
        pipeline = self.pipelines["delete"]
        msg = self._parse(DeleteMsg, record)
        if msg is None:
            return
        await sleep_until(msg.not_before)
        for step, when in ((self.delete.mark, 0.0), (self.delete.purge, msg.time + self.config.delete_safe_delay)):
            await sleep_until(when)
            async with pipeline.slots:
                try:
                    await step(msg)
                except Exception as exc:
                    await pipeline.hand_on(Topic.BLOB_DELETE_FAILED, msg, self.policy, f"{type(exc).__name__}: {exc}")
                    return
        pipeline.stats["done"] += 1

    def _parse(self, model: type[RepairMsg] | type[DeleteMsg], record: Record) -> Any:
        """A message that is not one of ours (malformed, or another cluster's) is skipped, never retried."""
        try:
            msg = model.model_validate_json(record.value)
        except ValidationError as exc:
            log.error("skipping malformed message %s/%d@%d: %s", record.topic, record.partition, record.offset, exc)
            return None
        return msg if msg.cluster_id == self.config.cluster_id else None

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: dict(p.stats) for name, p in self.pipelines.items()}
        for name, group, topics in pipelines(self.config.group_prefix):
            out.setdefault(name, {})["lag"] = await asyncio.to_thread(
                lag, self.config.kafka_bootstrap, group, [str(t) for t in topics])
        return out

