"""`python -m services.clustermgr -c clustermgr.json`"""

from __future__ import annotations

from libs.rpc.server import ASGIApp, run_service
from services.clustermgr.app import build_app
from services.clustermgr.config import ClusterMgrConfig
from services.clustermgr.manager import ClusterManager


def build(config: ClusterMgrConfig) -> tuple[ASGIApp, str]:
    return build_app(ClusterManager(config)), config.me.http_addr


if __name__ == "__main__":
    run_service("clustermgr", ClusterMgrConfig, build)
