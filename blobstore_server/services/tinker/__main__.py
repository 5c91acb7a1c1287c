"""`python -m blobstore_server.services.tinker -c tinker.json`"""

from __future__ import annotations

from blobstore_server.libs.proto.tinker import ROUTES
from blobstore_server.libs.rpc.metrics import register_collector
from blobstore_server.libs.rpc.server import ASGIApp, run_service
from blobstore_server.services.tinker.app import build_app
from blobstore_server.services.tinker.config import TinkerConfig
from blobstore_server.services.tinker.metrics import TinkerFigures
from blobstore_server.services.tinker.tinker import Tinker


def build(config: TinkerConfig) -> tuple[ASGIApp, str]:
    tinker = Tinker(config)
    figures = TinkerFigures(tinker)
    tinker.life.loop(figures.refresh_lag)
    register_collector(figures.collect)
    return build_app(tinker), config.bind_addr


if __name__ == "__main__":
    run_service("tinker", TinkerConfig, build, routes=ROUTES)
