"""`python -m services.blobnode -c blobnode.json`"""

from __future__ import annotations

import argparse
import asyncio
import logging

from libs.rpc.config import load_config
from libs.rpc.server import serve
from services.blobnode.app import build_app
from services.blobnode.cluster import ClusterLink, assign_disk_ids
from services.blobnode.config import BlobnodeConfig
from services.blobnode.node import Blobnode
from services.clustermgr.client import ClusterClient


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.blobnode")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s blobnode %(levelname)s %(message)s")
    config = load_config(args.config, BlobnodeConfig)
    link = None
    if config.clustermgr_hosts:
        config = asyncio.run(_with_disk_ids(config))
    node = Blobnode(config)
    if config.clustermgr_hosts:
        link = ClusterLink(node, ClusterClient(config.clustermgr_hosts), config.heartbeat_interval)
    try:
        serve(build_app(node, link), config.bind_addr)
    finally:
        node.close()


async def _with_disk_ids(config: BlobnodeConfig) -> BlobnodeConfig:
    async with ClusterClient(config.clustermgr_hosts) as cluster:
        return await assign_disk_ids(config, cluster)


if __name__ == "__main__":
    main()
