"""tinker HTTP routes: health and stats (messages in, done, failed, retried, consumer lag)."""

from __future__ import annotations

from fastapi import FastAPI

from blobstore_server.libs.proto import tinker as api
from blobstore_server.libs.proto.tinker import TinkerStats
from blobstore_server.libs.rpc.server import create_app, serves
from blobstore_server.services.tinker.tinker import Tinker


def build_app(tinker: Tinker) -> FastAPI:
    app = create_app("tinker", on_start=tinker.start, on_stop=tinker.life.stop)

    @serves(app, api.STATS)
    async def stats() -> TinkerStats:
        return await tinker.stats()

    return app
