"""One consumer group's loop: poll, work on each message in its own task, commit what is done.

Offsets are committed only up to the first message whose work is not finished (or durably handed
on to the failed topic), so a crash replays exactly the unfinished ones. A message that must wait
(its retry back-off, or a delete's safe delay) waits in its own task: nothing else is held up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from blobstore_server.libs.mq.consumer import Consumer, Record
from blobstore_server.libs.mq.offsets import OffsetTracker
from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.topics import Topic
from blobstore_server.libs.proto.messages import BlobMsg
from blobstore_server.libs.proto.switches import Switches, TaskType
from blobstore_server.libs.proto.tinker import PipelineStats
from blobstore_server.services.tinker.rules import RetryPolicy

log = logging.getLogger(__name__)
Handler = Callable[[Record], Awaitable[None]]
# A poll returns as soon as records arrive; the wait only bounds how late a task switch turned off is applied.
POLL_WAIT = 1.0


async def sleep_until(moment: float) -> None:
    delay = moment - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


class Pipeline:
    def __init__(self, name: str, consumer: Consumer, producer: Producer, handle: Handler, *,
                 slots: asyncio.Semaphore, commit_interval: float, switches: Switches, task: TaskType) -> None:
        self.name = name
        self.switches = switches
        self.task = task  # while its switch is off nothing new is fetched (the handler waits for it too)
        self.consumer = consumer
        self.producer = producer
        self.handle = handle
        self.tracker = OffsetTracker()
        self.slots = slots  # how many messages are worked on at once (may be shared between pipelines)
        self.commit_interval = commit_interval
        self.stats = PipelineStats()
        self.idle = asyncio.Event()  # set while no message of this pipeline is being worked on
        self.idle.set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        committer = asyncio.create_task(self._commit_loop())
        try:
            while True:
                self.stats.paused = not self.switches.is_on(self.task)
                records = await self.consumer.poll(timeout=POLL_WAIT, paused=self.stats.paused)
                for record in records:
                    self.tracker.add(record.tp, record.offset)
                    self.stats.messages_in += 1
                    task = asyncio.create_task(self._work(record))
                    self._tasks.add(task)
                    self.idle.clear()
                    task.add_done_callback(self._finished)
        finally:
            committer.cancel()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self.idle.set()

    async def _work(self, record: Record) -> None:
        try:
            await self.handle(record)
        except asyncio.CancelledError:
            raise  # shutting down: not done, so not committed; it is delivered again
        except Exception:
            log.exception("%s: unexpected failure on %s/%d@%d", self.name, record.topic, record.partition,
                          record.offset)
            return  # left uncommitted on purpose: a restart works on it again
        self.tracker.done(record.tp, record.offset)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.commit_interval)
            offsets = self.tracker.committable()
            if offsets and await self.consumer.commit(offsets):
                self.tracker.mark_committed(offsets)

    async def hand_on(self, topic: Topic, msg: BlobMsg, policy: RetryPolicy, why: str) -> None:
        """Publish a failed message to its failed topic with the next retry and back-off; keep trying
        until Kafka takes it, since only then may its original offset be committed."""
        retry = msg.retry + 1
        again = msg.model_copy(update={"retry": retry, "not_before": time.time() + policy.backoff(retry)})
        log.warning("%s: %s/%s failed (%s); retry %d later", self.name, msg.vid, msg.bid, why, retry)
        self.stats.failed += 1
        self.stats.retried += 1
        delay = policy.base
        while True:
            try:
                await self.producer.send(topic, again.key(), again.to_bytes())
                return
            except Exception as exc:  # librdkafka's errors: keep the message until Kafka is back
                log.warning("%s: cannot publish to %s yet: %s", self.name, topic, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, policy.cap)
