"""`python -m blobstore_server.services.blobnode -c blobnode.json`"""

from __future__ import annotations

import asyncio

from blobstore_server.libs.openfiles import lift_open_file_limit
from blobstore_server.libs.proto.blobnode import ROUTES
from blobstore_server.libs.rpc.metrics import register_collector
from blobstore_server.libs.rpc.server import ASGIApp, run_service
from blobstore_server.services.blobnode.app import build_app
from blobstore_server.services.blobnode.cluster import ClusterLink, assign_disk_ids
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.figures import disk_figures, scrub_figures
from blobstore_server.services.blobnode.node import Blobnode
from blobstore_server.services.blobnode.reader_process import ReaderForks, ReaderProcess
from blobstore_server.services.blobnode.scrubber import Scrubber
from blobstore_server.services.blobnode.upkeep import Upkeep
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.mqproxy.client import MqProxyClient

# Open files a blobnode needs besides its chunk files: RocksDB's tables and logs, sockets, its own code.
OTHER_OPEN_FILES = 1024


def build(config: BlobnodeConfig) -> tuple[ASGIApp, str]:
    lift_open_file_limit(sum(d.max_chunks for d in config.disks) + OTHER_OPEN_FILES)  # every chunk file stays open
    if config.clustermgr_hosts:
        config = asyncio.run(_with_disk_ids(config))
    forks = ReaderForks.start() if config.background_reader else None  # before the node's threads start
    node = Blobnode(config)
    register_collector(lambda: disk_figures(node))
    cluster = ClusterClient(config.clustermgr_hosts) if config.clustermgr_hosts else None
    scrubber = Scrubber(node, None if cluster is None else MqProxyClient(cluster=cluster))  # any live mqproxy
    register_collector(lambda: scrub_figures(scrubber))
    link = None if cluster is None else ClusterLink(node, cluster, config.heartbeat_interval, scrubber)
    return build_app(node, link, scrubber, ReaderProcess(config, forks), Upkeep(node)), config.bind_addr


async def _with_disk_ids(config: BlobnodeConfig) -> BlobnodeConfig:
    async with ClusterClient(config.clustermgr_hosts) as cluster:
        return await assign_disk_ids(config, cluster)


if __name__ == "__main__":
    run_service("blobnode", BlobnodeConfig, build, routes=ROUTES)
