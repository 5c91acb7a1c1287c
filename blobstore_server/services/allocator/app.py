"""Allocator HTTP routes."""

from __future__ import annotations

from fastapi import FastAPI

from blobstore_server.libs.proto import allocator as api
from blobstore_server.libs.proto.allocator import AllocatorStat, AllocRequest, AllocResult
from blobstore_server.libs.rpc.errors import BadRequest
from blobstore_server.libs.rpc.server import create_app, serves
from blobstore_server.services.allocator.allocator import Allocator


def build_app(allocator: Allocator) -> FastAPI:
    app = create_app("allocator", on_start=allocator.life.start, on_stop=allocator.life.stop)

    @serves(app, api.ALLOC)
    async def volume_alloc(req: AllocRequest) -> AllocResult:
        mode = req.code_mode
        if mode not in allocator.modes:
            raise BadRequest(f"this allocator serves {[m.name for m in allocator.modes]}, not {mode.name}")
        allocator.volumes_full(req.full_vids)
        blobs = await allocator.allocate(mode, req.size, req.blob_size, req.exclude_vids, req.avoid_disks, req.bids,
                                         req.returned)
        return AllocResult(code_mode=mode, blobs=blobs)

    @serves(app, api.STAT)
    async def stat() -> AllocatorStat:
        return allocator.stat()

    return app
