"""Worker HTTP routes."""

from __future__ import annotations

from fastapi import FastAPI

from blobstore_server.libs.proto.worker import RepairResult, ShardRepair, WorkerStats
from blobstore_server.libs.rpc.server import Lifecycle, create_app
from blobstore_server.services.worker.repair import ShardRepairer


def build_app(repairer: ShardRepairer, life: Lifecycle) -> FastAPI:
    app = create_app("worker", on_start=life.start, on_stop=life.stop)

    @app.post("/shard/repair")
    async def shard_repair(req: ShardRepair) -> RepairResult:
        return await repairer.repair(req.vid, req.bid, req.bad_indexes)

    @app.get("/stats")
    async def stats() -> WorkerStats:
        return repairer.stats

    return app
