"""`python -m services.mqproxy -c mqproxy.json`"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from libs.mq.admin import ensure_topics
from libs.mq.producer import Producer
from libs.rpc.config import load_config
from libs.rpc.server import serve
from services.clustermgr.client import ClusterClient, keep_registered
from services.mqproxy.app import Publisher, build_app
from services.mqproxy.config import MqProxyConfig


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.mqproxy")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s mqproxy %(levelname)s %(name)s %(message)s")
    config = load_config(args.config, MqProxyConfig)
    cluster = ClusterClient(config.clustermgr_hosts)
    publisher = Publisher()
    tasks: list[asyncio.Task[None]] = []

    async def start() -> None:
        await asyncio.to_thread(ensure_topics, config.kafka_bootstrap, config.partitions)
        publisher.producer = await Producer.connect(config.kafka_bootstrap, client_id="mqproxy")
        tasks.append(asyncio.create_task(
            keep_registered(cluster, "mqproxy", config.advertised_host, config.idc, config.register_ttl)))

    async def stop() -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if publisher.producer is not None:
            await publisher.producer.close()
        await cluster.close()

    serve(build_app(publisher, start, stop), config.bind_addr)


if __name__ == "__main__":
    main()
