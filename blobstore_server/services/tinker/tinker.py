"""tinker: the repair and delete pipelines, wired to their handlers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from blobstore_server.libs.mq.admin import LagReader
from blobstore_server.libs.mq.consumer import Consumer, Record
from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.seal import Forged, unseal
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.mq.topics import Topic, pipelines
from blobstore_server.libs.proto.messages import BlobMsg, DeleteMsg, RepairMsg
from blobstore_server.libs.proto.switches import Switches, TaskType
from blobstore_server.libs.proto.tinker import PipelineStats, TinkerStats
from blobstore_server.libs.rpc.server import Lifecycle
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.tinker.config import TinkerConfig
from blobstore_server.services.tinker.handlers import Blob, DeleteHandler, RepairHandler
from blobstore_server.services.tinker.pipeline import Pipeline, sleep_until
from blobstore_server.services.tinker.rules import RetryPolicy, delete_due
from blobstore_server.services.worker.client import WorkerClient

log = logging.getLogger(__name__)
Msg = TypeVar("Msg", bound=BlobMsg)


class Tinker:
    def __init__(self, config: TinkerConfig) -> None:
        self.config = config
        self.policy = RetryPolicy(config.retry_base, config.retry_cap)
        self.cluster = ClusterClient(config.clustermgr_hosts)
        self.blobnodes = BlobnodeClient()
        self.workers = WorkerClient()
        self.repair = RepairHandler(self.cluster, self.workers)
        self.delete = DeleteHandler(self.cluster, self.blobnodes, Path(config.delete_log),
                                    config.auth.minter(Kind.DELETE) if config.auth else None)
        self.pipelines: dict[str, Pipeline] = {}
        self.switches = Switches()
        self._producer: Producer | None = None
        # With a message key, a message is acted upon only under its producer's seal, and what tinker hands on
        # to a failed or retry topic is sealed anew; without one (no auth) messages travel unsealed.
        self.message_key = bytes.fromhex(config.message_key) if config.message_key else None
        self.forged: dict[str, int] = {  # topic -> messages skipped for a missing or wrong seal
            str(topic): 0 for spec in pipelines(config.group_prefix) for topic in spec.topics}
        self.login = client_auth(config.kafka_auth)  # librdkafka settings of its Kafka user; {}: PLAINTEXT
        self.lags = LagReader(config.kafka_bootstrap, client=self.login)
        self.life = Lifecycle()
        self.life.close(self._close)

    async def start(self) -> None:
        """Connect to Kafka and start every pipeline (the app's start hook)."""
        bootstrap = self.config.kafka_bootstrap
        await self.life.start()
        self.life.loop(lambda: self.switches.follow(self.cluster.list_config, self.config.switch_interval))
        self._producer = await Producer.connect(bootstrap, client_id="tinker", seal_key=self.message_key,
                                                **self.login)
        repair_slots = asyncio.Semaphore(self.config.concurrency)  # shared by both repair pipelines
        for spec in pipelines(self.config.group_prefix):
            consumer = await Consumer.connect(bootstrap, spec.group, spec.topics, **self.login)
            deletes = spec.name in ("delete", "reclaim")
            handle = functools.partial(self._on_delete if deletes else self._on_repair, spec.name)
            slots = asyncio.Semaphore(self.config.concurrency) if deletes else repair_slots
            task = TaskType.BLOB_DELETE if deletes else TaskType.SHARD_REPAIR
            pipeline = Pipeline(spec.name, consumer, self._producer, handle, slots=slots,
                                commit_interval=self.config.commit_interval, switches=self.switches, task=task)
            self.pipelines[spec.name] = pipeline
            self.life.loop(pipeline.run)

    async def _close(self) -> None:
        for pipeline in self.pipelines.values():
            await pipeline.consumer.close()
        if self._producer is not None:
            await self._producer.close()
        for client in (self.cluster, self.blobnodes, self.workers):
            await client.close()
        await asyncio.to_thread(self.lags.close)

    async def _on_repair(self, name: str, record: Record) -> None:
        pipeline = self.pipelines[name]
        msg = self._parse(RepairMsg, record)
        if msg is None:
            return
        if pipeline is self.pipelines["repair_prior"]:  # rare and urgent: worth a line when it is taken
            log.info("priority repair of blob %d/%d shards %s taken", msg.vid, msg.bid, msg.bad_indexes)
        await sleep_until(msg.not_before)
        await self.switches.wait_on(TaskType.SHARD_REPAIR)
        async with self._repair_slot(pipeline):
            try:
                await self.repair(msg)
                pipeline.stats.done += 1
            except Exception as exc:
                await pipeline.hand_on(Topic.SHARD_REPAIR_FAILED, msg, self.policy, f"{type(exc).__name__}: {exc}")

    @contextlib.asynccontextmanager
    async def _repair_slot(self, pipeline: Pipeline) -> AsyncIterator[None]:
        """A repair slot; an ordinary repair waits while any priority repair is being worked on (checked
        again after acquiring, so queued ordinary repairs cannot jump ahead)."""
        prior = self.pipelines["repair_prior"]
        while True:
            if pipeline is not prior:
                await prior.idle.wait()
            await pipeline.slots.acquire()
            if pipeline is prior or prior.idle.is_set():
                break
            pipeline.slots.release()
        try:
            yield
        finally:
            pipeline.slots.release()

    async def _on_delete(self, name: str, record: Record) -> None:
        """A delete, or (pipeline "reclaim") a multipart upload's reclaim: deleted unless it was finished."""
        pipeline = self.pipelines[name]
        msg = self._parse(DeleteMsg, record)
        if msg is None:
            return
        retry_topic = Topic.UPLOAD_RECLAIM if msg.upload else Topic.BLOB_DELETE_FAILED
        await sleep_until(msg.not_before)
        if msg.upload:
            await self.switches.wait_on(TaskType.BLOB_DELETE)
            try:
                finished = await self.delete.upload_finished(msg)
            except Exception as exc:
                await pipeline.hand_on(retry_topic, msg, self.policy, f"{type(exc).__name__}: {exc}")
                return
            if finished:
                pipeline.stats.done += 1
                return
            log.info("reclaiming the unfinished upload from blob %d/%d", msg.vid, msg.bid)
        marked = await self._delete_step(pipeline, msg, retry_topic, lambda: self.delete.mark(msg))
        if marked is None:
            return
        purged: list[Blob] = []
        if marked:
            marked_at = time.time()
            await asyncio.sleep(delete_due(marked_at, self.config.delete_safe_delay, now=time.time()))
            done = await self._delete_step(pipeline, msg, retry_topic, lambda: self.delete.purge(msg, marked))
            if done is None:
                return
            purged = done
        if len(purged) < len(msg.blob_ids()):
            pipeline.stats.undeleted += 1
        pipeline.stats.done += 1

    async def _delete_step(self, pipeline: Pipeline, msg: DeleteMsg, retry_topic: Topic,
                           step: Callable[[], Awaitable[list[Blob]]]) -> list[Blob] | None:
        """One step of a delete, in a slot and while deletes are switched on: the blobs it went on with; None when
        it failed and the message was handed on for a retry (from the start)."""
        await self.switches.wait_on(TaskType.BLOB_DELETE)
        async with pipeline.slots:
            try:
                return await step()
            except Exception as exc:
                await pipeline.hand_on(retry_topic, msg, self.policy, f"{type(exc).__name__}: {exc}")
                return None

    def _parse(self, model: type[Msg], record: Record) -> Msg | None:
        """A message that is not one of ours (malformed, another cluster's, or not sealed by our producers) is
        skipped, never retried: returning None lets its offset be committed, so it blocks nothing.

        The cluster id is read before the seal is checked: another cluster sharing this Kafka seals with its
        own key, and its messages are merely not ours, not forged."""
        try:
            msg = model.model_validate_json(record.value)
        except ValidationError as exc:
            log.error("skipping malformed message %s/%d@%d: %s", record.topic, record.partition, record.offset, exc)
            return None
        if msg.cluster_id != self.config.cluster_id:
            return None
        if self.message_key is not None:
            try:
                unseal(self.message_key, record.topic, record.value, record.headers)
            except Forged as exc:
                self.forged[record.topic] = self.forged.get(record.topic, 0) + 1
                log.warning("ignoring a forged message %s/%d@%d (%s): blob %d/%d is left alone", record.topic,
                            record.partition, record.offset, exc, msg.vid, msg.bid)
                return None
        return msg

    async def stats(self) -> TinkerStats:
        out: dict[str, PipelineStats] = {}
        for spec in pipelines(self.config.group_prefix):
            counters = self.pipelines[spec.name].stats if spec.name in self.pipelines else PipelineStats()
            lags = await asyncio.to_thread(self.lags.lag, spec.group, [str(t) for t in spec.topics])
            out[spec.name] = counters.model_copy(update={"lag": lags})
        return TinkerStats(pipelines=out)
