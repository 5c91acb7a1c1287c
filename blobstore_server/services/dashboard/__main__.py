"""`python -m blobstore_server.services.dashboard -c dashboard.json`"""

from __future__ import annotations

from blobstore_server.libs.rpc.client import HttpClient
from blobstore_server.libs.rpc.routes import NO_ROUTES
from blobstore_server.libs.rpc.server import ASGIApp, Lifecycle, run_service
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.dashboard.app import build_app
from blobstore_server.services.dashboard.config import DashboardConfig
from blobstore_server.services.dashboard.watcher import Watcher


def build(config: DashboardConfig) -> tuple[ASGIApp, str]:
    life = Lifecycle()
    cluster = ClusterClient(config.clustermgr_hosts, deadline=config.scrape_timeout)
    http = HttpClient(timeout=config.scrape_timeout)
    watcher = Watcher(config, cluster, http)
    for loop in (watcher.scrape_loop, watcher.cluster_loop, watcher.backlog_loop):
        life.loop(loop)
    life.close(cluster.close, http.close, watcher.close)
    return build_app(watcher, life), config.bind_addr


if __name__ == "__main__":
    run_service("dashboard", DashboardConfig, build, routes=NO_ROUTES, public=True)  # its API is open
