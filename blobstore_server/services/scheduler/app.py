"""Scheduler HTTP routes: the worker task protocol, manual migrations and status. Only the active instance
answers them; a standby answers 503 naming the leader."""

from __future__ import annotations

from fastapi import FastAPI

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
from blobstore_server.libs.rpc.server import Lifecycle, create_app
from blobstore_server.services.scheduler.scheduler import Scheduler


def build_app(scheduler: Scheduler, life: Lifecycle) -> FastAPI:
    app = create_app("scheduler", on_start=life.start, on_stop=life.stop)

    @app.post("/task/acquire")
    async def acquire(req: AcquireRequest) -> AcquireResult:
        return await scheduler.acquire(req)

    @app.post("/task/renew")
    async def renew(req: TaskRef) -> TaskAck:
        return await scheduler.renew(req)

    @app.post("/task/report")
    async def report(req: TaskProgress) -> TaskAck:
        return await scheduler.report(req)

    @app.post("/task/complete")
    async def complete(req: TaskRef) -> TaskAck:
        return await scheduler.complete(req)

    @app.post("/task/cancel")
    async def cancel(req: TaskCancel) -> TaskAck:
        return await scheduler.cancel(req)

    @app.post("/task/migrate")
    async def migrate(req: ManualMigrate) -> TaskRecord:
        return await scheduler.manual_migrate(req)

    @app.get("/task/list")
    async def task_list() -> TaskList:
        scheduler.require_active()
        return TaskList(tasks=sorted(scheduler.tasks.values(), key=lambda t: t.ctime))

    @app.get("/status")
    async def status() -> SchedulerStatus:
        return scheduler.status()

    return app
