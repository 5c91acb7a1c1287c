"""`python -m services.allocator -c allocator.json`"""

from __future__ import annotations

from libs.rpc.server import ASGIApp, run_service
from services.allocator.allocator import Allocator
from services.allocator.app import build_app
from services.allocator.config import AllocatorConfig


def build(config: AllocatorConfig) -> tuple[ASGIApp, str]:
    return build_app(Allocator(config)), config.bind_addr


if __name__ == "__main__":
    run_service("allocator", AllocatorConfig, build)
