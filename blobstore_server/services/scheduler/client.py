"""Typed async client of the scheduler (workers and the CLI): it finds the active instance through the
election record in clustermgr's kv and follows it across a takeover."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from pydantic import BaseModel

from blobstore_server.libs.proto import scheduler as api
from blobstore_server.libs.proto.scheduler import (
    LEADER_KEY,
    AcquireRequest,
    AcquireResult,
    LeaderRecord,
    ManualMigrate,
    SchedulerStatus,
    TaskAck,
    TaskCancel,
    TaskList,
    TaskProgress,
    TaskRecord,
    TaskRef,
)
from blobstore_server.libs.rpc.client import HttpClient, ServiceClient
from blobstore_server.libs.rpc.errors import Unavailable
from blobstore_server.libs.rpc.routes import Route
from blobstore_server.services.clustermgr.client import ClusterClient

M = TypeVar("M", bound=BaseModel)


class SchedulerClient(ServiceClient):
    def __init__(self, cluster: ClusterClient, http: HttpClient | None = None, *, deadline: float = 10.0) -> None:
        super().__init__(api.ROUTES, http, timeout=5.0)
        self.cluster, self.deadline = cluster, deadline
        self.active: str | None = None

    async def _active(self) -> str:
        raw = await self.cluster.kv_get(LEADER_KEY)
        if raw is None:
            raise Unavailable("no scheduler has been elected")
        return LeaderRecord.model_validate_json(raw).host

    async def _call(self, route: Route[M], body: BaseModel | None = None) -> M:
        """The call on the active scheduler; while none answers (a takeover takes seconds), look it up again
        until the deadline."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.deadline
        while True:
            try:
                self.active = self.active or await self._active()
                return await self.http.call_route(route, self.active, body=body)
            except Unavailable:
                self.active = None
                if loop.time() >= give_up:
                    raise
                await asyncio.sleep(0.5)

    async def acquire(self, req: AcquireRequest) -> AcquireResult:
        return await self._call(api.TASK_ACQUIRE, req)

    async def renew(self, ref: TaskRef) -> TaskAck:
        return await self._call(api.TASK_RENEW, ref)

    async def report(self, progress: TaskProgress) -> TaskAck:
        return await self._call(api.TASK_REPORT, progress)

    async def complete(self, ref: TaskRef) -> TaskAck:
        return await self._call(api.TASK_COMPLETE, ref)

    async def cancel(self, req: TaskCancel) -> TaskAck:
        return await self._call(api.TASK_CANCEL, req)

    async def manual_migrate(self, req: ManualMigrate) -> TaskRecord:
        return await self._call(api.TASK_MIGRATE, req)

    async def tasks(self) -> TaskList:
        return await self._call(api.TASK_LIST)

    async def status(self, host: str) -> SchedulerStatus:
        return await self.http.call_route(api.STATUS, host.rstrip("/"))
