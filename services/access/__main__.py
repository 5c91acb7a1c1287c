"""`python -m services.access -c access.json`"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from libs.rpc.config import load_config
from libs.rpc.errors import RpcError
from libs.rpc.server import serve
from services.access.app import build_app
from services.access.blobs import ShardIO
from services.access.config import AccessConfig
from services.access.objects import ObjectStore
from services.access.volumes import VolumeCache
from services.allocator.client import AllocatorClient
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from services.mqproxy.client import MqProxyClient

log = logging.getLogger("access")
POLICY_REFRESH = 30.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.access")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s access %(levelname)s %(name)s %(message)s")
    config = load_config(args.config, AccessConfig)
    cluster = ClusterClient(config.clustermgr_hosts)
    redis = None
    if config.redis_url:
        import redis.asyncio as aioredis

        redis = aioredis.from_url(config.redis_url)
    volumes = VolumeCache(cluster, config.volume_cache_ttl, redis)
    blobnodes = BlobnodeClient()
    allocator = AllocatorClient(config.allocator_hosts)
    mq = MqProxyClient(config.mqproxy_hosts, cluster)
    store = ObjectStore(config, ShardIO(blobnodes, volumes, config.shard_timeout), volumes, allocator, mq)
    tasks: list[asyncio.Task[None]] = []

    async def refresh_policy() -> None:
        while True:
            try:
                store.policy.load(await cluster.get_config("code_mode_policy"))
            except RpcError as exc:
                log.warning("cannot load the code-mode policy: %s", exc)
            await asyncio.sleep(POLICY_REFRESH)

    async def start() -> None:
        tasks.append(asyncio.create_task(refresh_policy()))

    async def stop() -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for client in (cluster, blobnodes, allocator, mq):
            await client.close()
        if redis is not None:
            await redis.aclose()

    serve(build_app(store, start, stop), config.bind_addr)


if __name__ == "__main__":
    main()
