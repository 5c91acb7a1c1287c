"""Allocator HTTP routes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from libs.ec import UnknownCodeMode, parse_code_mode
from libs.rpc.errors import BadRequest
from libs.rpc.server import create_app
from services.allocator.allocator import Allocator

MAX_OBJECT = 5 << 30


class AllocRequest(BaseModel):
    code_mode: int | str
    size: int = Field(ge=0, le=MAX_OBJECT)
    blob_size: int = Field(4 << 20, ge=1, le=32 << 20)


def build_app(allocator: Allocator) -> FastAPI:
    app = create_app("allocator", on_start=allocator.start, on_stop=allocator.stop)

    @app.post("/volume/alloc")
    async def volume_alloc(req: AllocRequest) -> dict[str, Any]:
        try:
            mode = parse_code_mode(req.code_mode)
        except UnknownCodeMode as exc:
            raise BadRequest(str(exc)) from None
        if mode not in allocator.modes:
            raise BadRequest(f"this allocator serves {[m.name for m in allocator.modes]}, not {mode.name}")
        allocations = await allocator.allocate(mode, req.size, req.blob_size)
        return {"code_mode": int(mode), "blobs": [vars(a) for a in allocations]}

    @app.get("/stat")
    async def stat() -> dict[str, Any]:
        return {"holder": allocator.holder, "bids_left": allocator.pool.bids.left,
                "volumes": [vars(v) for v in allocator.pool.volumes.values()]}

    return app
