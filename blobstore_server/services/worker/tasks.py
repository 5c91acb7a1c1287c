"""The worker's task loop: acquire a unit move from the scheduler, run it with the migrate engine while
renewing its lease, then complete it, or cancel it saying why. A refused renewal or report (the task was
fenced: its lease lapsed and it went to another worker, or its switch was turned off), or a discard the
destination refuses (a stale task token), stops the run at once, and nothing more is said about that task.

The worker keeps its own deadline too (`rules.LeaseDeadline`): once a renewal has not gone through for most of
the lease, the task may have gone to another worker, and this one stops touching it (the run is cancelled, no
call of it reaches the destination or the scheduler any more), whatever the scheduler would still answer."""

from __future__ import annotations

import asyncio
import logging
import time

from blobstore_server.libs.proto.scheduler import AcquireRequest, TaskCancel, TaskProgress, TaskRef, WorkTask
from blobstore_server.libs.rpc.errors import Conflict, Fenced, RpcError
from blobstore_server.services.scheduler.client import SchedulerClient
from blobstore_server.services.worker.migrate import DestinationFailed, UnitMigrator
from blobstore_server.services.worker.rules import LeaseDeadline, LeaseLapsed

log = logging.getLogger(__name__)


class TaskLost(Exception):
    """The scheduler refused a renewal or report: the task is not ours any more."""


class TaskRunner:
    def __init__(self, scheduler: SchedulerClient, migrator: UnitMigrator, worker: str, poll: float,
                 urgent_only: bool = False, lease_margin: float = 0.2) -> None:
        """`lease_margin`: the part of a task's lease kept in hand (`LeaseDeadline`)."""
        self.scheduler, self.migrator, self.worker, self.poll = scheduler, migrator, worker, poll
        self.urgent_only, self.lease_margin = urgent_only, lease_margin

    async def run(self) -> None:
        """Work tasks one after another until cancelled."""
        while True:
            sent = time.monotonic()
            try:
                got = await self.scheduler.acquire(AcquireRequest(worker=self.worker, urgent_only=self.urgent_only))
            except RpcError as exc:
                log.info("no task: %s", exc)
                got = None
            if got is None or got.task is None:
                await asyncio.sleep(self.poll)
                continue
            await self.work(got.task, sent)

    async def work(self, task: WorkTask, acquired: float) -> None:
        """Run `task`, whose acquire was sent at `acquired` (monotonic): the lease counts from there."""
        ref = task.ref
        lease = LeaseDeadline(task.lease_ttl, task.lease_ttl * self.lease_margin, acquired)
        log.info("task %s: volume %d unit %d, disk %d -> %d (token %d)", ref.task_id, task.vid, task.unit_index,
                 task.source.disk_id, task.destination.disk_id, ref.token)
        try:
            await self._migrate(task, lease)
        except LeaseLapsed as exc:
            self.migrator.stats.lapsed_tasks += 1
            log.warning("task %s given up, touched no more: %s", ref.task_id, exc)
            return
        except (TaskLost, Fenced) as exc:  # Fenced: the destination refused this hand-out's token
            self.migrator.stats.fenced_tasks += 1
            log.warning("task %s fenced, stopped: %s", ref.task_id, exc)
            return
        except DestinationFailed as exc:
            await self._cancel(ref, lease, str(exc), destination_failed=True)
            return
        except RpcError as exc:  # a moved unit (Conflict), unreachable shards, a lost blob: the scheduler decides
            await self._cancel(ref, lease, f"{type(exc).__name__}: {exc}")
            return
        try:
            lease.check(time.monotonic())
            ack = await self.scheduler.complete(ref)
            log.info("task %s complete: %s", ref.task_id, ack.state)
        except LeaseLapsed as exc:  # the next holder finds every shard in place and completes it
            self.migrator.stats.lapsed_tasks += 1
            log.warning("task %s done but not completed: %s", ref.task_id, exc)
        except RpcError as exc:
            log.warning("task %s: complete refused: %s", ref.task_id, exc)

    async def _migrate(self, task: WorkTask, lease: LeaseDeadline) -> None:
        def guard() -> None:
            lease.check(time.monotonic())

        async def report(progress: TaskProgress) -> None:
            guard()
            try:
                await self.scheduler.report(progress)
            except Conflict as exc:
                raise TaskLost(str(exc)) from exc

        async def keep_lease() -> None:
            while True:
                await asyncio.sleep(lease.renew_interval)
                sent = time.monotonic()
                try:
                    await self.scheduler.renew(task.ref)
                except Conflict as exc:
                    raise TaskLost(str(exc)) from exc
                except RpcError as exc:  # the scheduler is changing hands: try again while the deadline allows
                    log.info("task %s: renewal failed: %s", task.ref.task_id, exc)
                    continue
                lease.renewed(sent)

        async def watch_deadline() -> None:
            while True:
                guard()
                await asyncio.sleep(lease.deadline - time.monotonic())

        guards = [asyncio.create_task(keep_lease()), asyncio.create_task(watch_deadline())]
        work = asyncio.create_task(self.migrator.migrate(task, report, guard))
        try:
            done, _ = await asyncio.wait({*guards, work}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                for stopped in done:
                    stopped.result()  # raises TaskLost or LeaseLapsed
            await work
        finally:
            for running in (*guards, work):
                running.cancel()
            await asyncio.gather(*guards, work, return_exceptions=True)

    async def _cancel(self, ref: TaskRef, lease: LeaseDeadline, reason: str, destination_failed: bool = False) -> None:
        log.warning("task %s cancelled: %s", ref.task_id, reason)
        try:
            lease.check(time.monotonic())
            await self.scheduler.cancel(TaskCancel(ref=ref, reason=reason[:500], destination_failed=destination_failed))
        except LeaseLapsed as exc:  # not ours to give back any more: its lease runs out at the scheduler
            log.warning("task %s: cancel not sent: %s", ref.task_id, exc)
        except RpcError as exc:
            log.info("task %s: cancel refused: %s", ref.task_id, exc)
