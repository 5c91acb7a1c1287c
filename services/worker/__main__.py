"""`python -m services.worker -c worker.json`"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from libs.rpc.config import load_config
from libs.rpc.server import serve
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient, keep_registered
from services.worker.app import build_app
from services.worker.config import WorkerConfig
from services.worker.repair import ShardRepairer


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.worker")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(name)s %(message)s")
    config = load_config(args.config, WorkerConfig)
    cluster = ClusterClient(config.clustermgr_hosts)
    blobnodes = BlobnodeClient()
    tasks: list[asyncio.Task[None]] = []

    async def start() -> None:
        tasks.append(asyncio.create_task(
            keep_registered(cluster, "worker", config.advertised_host, config.idc, config.register_ttl)))

    async def stop() -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await cluster.close()
        await blobnodes.close()

    repairer = ShardRepairer(cluster, blobnodes, config.shard_timeout)
    serve(build_app(repairer, start, stop), config.bind_addr)


if __name__ == "__main__":
    main()
