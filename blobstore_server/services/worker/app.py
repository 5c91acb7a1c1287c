"""Worker HTTP routes."""

from __future__ import annotations

from fastapi import FastAPI

from blobstore_server.libs.proto import worker as api
from blobstore_server.libs.proto.worker import RepairResult, ShardRepair, WorkerStats
from blobstore_server.libs.rpc.server import Lifecycle, create_app, serves
from blobstore_server.services.worker.repair import ShardRepairer


def build_app(repairer: ShardRepairer, life: Lifecycle) -> FastAPI:
    app = create_app("worker", on_start=life.start, on_stop=life.stop)

    @serves(app, api.SHARD_REPAIR)
    async def shard_repair(req: ShardRepair) -> RepairResult:
        return await repairer.repair(req.vid, req.bid, req.bad_indexes)

    @serves(app, api.STATS)
    async def stats() -> WorkerStats:
        return repairer.stats

    return app
