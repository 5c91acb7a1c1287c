"""The worker's task loop: acquire a unit move from the scheduler, run it with the migrate engine while
renewing its lease, then complete it, or cancel it saying why. A refused renewal or report (the task was
fenced: its lease lapsed and it went to another worker, or its switch was turned off) stops the run at
once, and nothing more is said about that task."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from blobstore_server.libs.proto.scheduler import AcquireRequest, TaskCancel, TaskProgress, TaskRef, WorkTask
from blobstore_server.libs.rpc.errors import Conflict, RpcError
from blobstore_server.services.scheduler.client import SchedulerClient
from blobstore_server.services.worker.migrate import DestinationFailed, UnitMigrator

log = logging.getLogger(__name__)


class Fenced(Exception):
    """The scheduler refused a renewal or report: the task is not ours any more."""


class TaskRunner:
    def __init__(self, scheduler: SchedulerClient, migrator: UnitMigrator, worker: str, poll: float,
                 urgent_only: bool = False) -> None:
        self.scheduler, self.migrator, self.worker, self.poll = scheduler, migrator, worker, poll
        self.urgent_only = urgent_only

    async def run(self) -> None:
        """Work tasks one after another until cancelled."""
        while True:
            try:
                got = await self.scheduler.acquire(AcquireRequest(worker=self.worker, urgent_only=self.urgent_only))
            except RpcError as exc:
                log.info("no task: %s", exc)
                got = None
            if got is None or got.task is None:
                await asyncio.sleep(self.poll)
                continue
            await self.work(got.task)

    async def work(self, task: WorkTask) -> None:
        ref = task.ref
        log.info("task %s: volume %d unit %d, disk %d -> %d", ref.task_id, task.vid, task.unit_index,
                 task.source.disk_id, task.destination.disk_id)
        try:
            await self._migrate(task)
        except Fenced as exc:
            log.warning("task %s fenced, stopped: %s", ref.task_id, exc)
            return
        except DestinationFailed as exc:
            await self._cancel(ref, str(exc), destination_failed=True)
            return
        except RpcError as exc:  # a moved unit (Conflict), unreachable shards, a lost blob: the scheduler decides
            await self._cancel(ref, f"{type(exc).__name__}: {exc}")
            return
        try:
            ack = await self.scheduler.complete(ref)
            log.info("task %s complete: %s", ref.task_id, ack.state)
        except RpcError as exc:
            log.warning("task %s: complete refused: %s", ref.task_id, exc)

    async def _migrate(self, task: WorkTask) -> None:
        async def report(progress: TaskProgress) -> None:
            try:
                await self.scheduler.report(progress)
            except Conflict as exc:
                raise Fenced(str(exc)) from exc

        async def keep_lease() -> None:
            while True:
                await asyncio.sleep(task.lease_ttl / 3)
                try:
                    await self.scheduler.renew(task.ref)
                except Conflict as exc:
                    raise Fenced(str(exc)) from exc
                except RpcError as exc:  # the scheduler is changing hands: try again, the lease has room
                    log.info("task %s: renewal failed: %s", task.ref.task_id, exc)

        lease = asyncio.create_task(keep_lease())
        work = asyncio.create_task(self.migrator.migrate(task, report))
        try:
            done, _ = await asyncio.wait({lease, work}, return_when=asyncio.FIRST_COMPLETED)
            if lease in done:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                lease.result()  # raises Fenced
            await work
        finally:
            lease.cancel()
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease

    async def _cancel(self, ref: TaskRef, reason: str, destination_failed: bool = False) -> None:
        log.warning("task %s cancelled: %s", ref.task_id, reason)
        with contextlib.suppress(RpcError):
            await self.scheduler.cancel(TaskCancel(ref=ref, reason=reason[:500], destination_failed=destination_failed))
