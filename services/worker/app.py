"""Worker HTTP routes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from libs.rpc.server import Lifecycle, create_app
from services.worker.repair import ShardRepairer


class ShardRepair(BaseModel):
    vid: int = Field(ge=1, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)
    bad_indexes: list[int] = Field(min_length=1)


def build_app(repairer: ShardRepairer, life: Lifecycle) -> FastAPI:
    app = create_app("worker", on_start=life.start, on_stop=life.stop)

    @app.post("/shard/repair")
    async def shard_repair(req: ShardRepair) -> dict[str, Any]:
        return asdict(await repairer.repair(req.vid, req.bid, req.bad_indexes))

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return dict(repairer.stats)

    return app
