"""`python -m services.tinker -c tinker.json`"""

from __future__ import annotations

from libs.rpc.metrics import register_collector
from libs.rpc.server import ASGIApp, run_service
from services.tinker.app import build_app
from services.tinker.config import TinkerConfig
from services.tinker.metrics import TinkerFigures
from services.tinker.tinker import Tinker


def build(config: TinkerConfig) -> tuple[ASGIApp, str]:
    tinker = Tinker(config)
    figures = TinkerFigures(tinker)
    tinker.life.loop(figures.refresh_lag)
    register_collector(figures.collect)
    return build_app(tinker), config.bind_addr


if __name__ == "__main__":
    run_service("tinker", TinkerConfig, build)
