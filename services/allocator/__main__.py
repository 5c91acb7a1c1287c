"""`python -m services.allocator -c allocator.json`"""

from __future__ import annotations

from libs.rpc.metrics import register_collector
from libs.rpc.server import ASGIApp, run_service
from services.allocator.allocator import Allocator
from services.allocator.app import build_app
from services.allocator.config import AllocatorConfig
from services.allocator.metrics import pool_figures


def build(config: AllocatorConfig) -> tuple[ASGIApp, str]:
    allocator = Allocator(config)
    register_collector(lambda: pool_figures(allocator.pool, config.lease_margin))
    return build_app(allocator), config.bind_addr


if __name__ == "__main__":
    run_service("allocator", AllocatorConfig, build)
