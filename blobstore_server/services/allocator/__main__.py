"""`python -m blobstore_server.services.allocator -c allocator.json`"""

from __future__ import annotations

from blobstore_server.libs.proto.allocator import ROUTES
from blobstore_server.libs.rpc.metrics import register_collector
from blobstore_server.libs.rpc.server import ASGIApp, run_service
from blobstore_server.services.allocator.allocator import Allocator
from blobstore_server.services.allocator.app import build_app
from blobstore_server.services.allocator.config import AllocatorConfig
from blobstore_server.services.allocator.metrics import pool_figures


def build(config: AllocatorConfig) -> tuple[ASGIApp, str]:
    allocator = Allocator(config)
    register_collector(lambda: pool_figures(allocator.pool, config.lease_margin))
    return build_app(allocator), config.bind_addr


if __name__ == "__main__":
    run_service("allocator", AllocatorConfig, build, routes=ROUTES)
