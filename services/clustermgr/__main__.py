"""`python -m services.clustermgr -c clustermgr.json`"""

from __future__ import annotations

from libs.rpc.metrics import register_collector
from libs.rpc.server import ASGIApp, run_service
from services.clustermgr.app import build_app
from services.clustermgr.config import ClusterMgrConfig
from services.clustermgr.manager import ClusterManager
from services.clustermgr.metrics import cluster_figures


def build(config: ClusterMgrConfig) -> tuple[ASGIApp, str]:
    cm = ClusterManager(config)
    register_collector(lambda: cluster_figures(cm))
    return build_app(cm), config.me.http_addr


if __name__ == "__main__":
    run_service("clustermgr", ClusterMgrConfig, build)
