"""`python -m blobstore_server.services.clustermgr -c clustermgr.json`"""

from __future__ import annotations

from blobstore_server.libs.proto.clustermgr import ROUTES
from blobstore_server.libs.rpc.metrics import register_collector
from blobstore_server.libs.rpc.server import ASGIApp, run_service
from blobstore_server.services.clustermgr.app import build_app
from blobstore_server.services.clustermgr.config import ClusterMgrConfig
from blobstore_server.services.clustermgr.figures import cluster_figures
from blobstore_server.services.clustermgr.manager import ClusterManager


def build(config: ClusterMgrConfig) -> tuple[ASGIApp, str]:
    cm = ClusterManager(config)
    register_collector(lambda: cluster_figures(cm))
    return build_app(cm), config.me.http_addr


if __name__ == "__main__":
    run_service("clustermgr", ClusterMgrConfig, build, routes=ROUTES)
