"""Scheduler HTTP routes: the worker task protocol, manual migrations and status. Only the active instance
answers them; a standby answers 503 naming the leader."""

from __future__ import annotations

from fastapi import FastAPI

from blobstore_server.libs.proto import scheduler as api
from blobstore_server.libs.proto.scheduler import (
    AcquireRequest,
    AcquireResult,
    ManualMigrate,
    SchedulerStatus,
    TaskAck,
    TaskCancel,
    TaskList,
    TaskProgress,
    TaskRecord,
    TaskRef,
)
from blobstore_server.libs.rpc.server import Lifecycle, create_app, serves
from blobstore_server.services.scheduler.scheduler import Scheduler


def build_app(scheduler: Scheduler, life: Lifecycle) -> FastAPI:
    app = create_app("scheduler", on_start=life.start, on_stop=life.stop)

    @serves(app, api.TASK_ACQUIRE)
    async def acquire(req: AcquireRequest) -> AcquireResult:
        return await scheduler.acquire(req)

    @serves(app, api.TASK_RENEW)
    async def renew(req: TaskRef) -> TaskAck:
        return await scheduler.renew(req)

    @serves(app, api.TASK_REPORT)
    async def report(req: TaskProgress) -> TaskAck:
        return await scheduler.report(req)

    @serves(app, api.TASK_COMPLETE)
    async def complete(req: TaskRef) -> TaskAck:
        return await scheduler.complete(req)

    @serves(app, api.TASK_CANCEL)
    async def cancel(req: TaskCancel) -> TaskAck:
        return await scheduler.cancel(req)

    @serves(app, api.TASK_MIGRATE)
    async def migrate(req: ManualMigrate) -> TaskRecord:
        return await scheduler.manual_migrate(req)

    @serves(app, api.TASK_LIST)
    async def task_list() -> TaskList:
        scheduler.require_active()
        return TaskList(tasks=sorted(scheduler.state.tasks.values(), key=lambda t: t.ctime))

    @serves(app, api.STATUS)
    async def status() -> SchedulerStatus:
        return scheduler.status()

    return app
