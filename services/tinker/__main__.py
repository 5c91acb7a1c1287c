"""`python -m services.tinker -c tinker.json`"""

from __future__ import annotations

from libs.rpc.server import ASGIApp, run_service
from services.tinker.app import build_app
from services.tinker.config import TinkerConfig
from services.tinker.tinker import Tinker


def build(config: TinkerConfig) -> tuple[ASGIApp, str]:
    return build_app(Tinker(config)), config.bind_addr


if __name__ == "__main__":
    run_service("tinker", TinkerConfig, build)
