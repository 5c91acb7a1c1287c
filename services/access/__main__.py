"""`python -m services.access -c access.json`"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from libs.proto.clustermgr import POLICY_KEY
from libs.rpc import metrics
from libs.rpc.errors import RpcError
from libs.rpc.server import ASGIApp, Lifecycle, run_service
from services.access.app import build_app
from services.access.audit import AuditLog
from services.access.blobs import ShardIO
from services.access.config import AccessConfig
from services.access.health import HealthTable
from services.access.metrics import count_bytes
from services.access.objects import ObjectStore
from services.allocator.client import AllocatorClient
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient, VolumeCache
from services.mqproxy.client import MqProxyClient

log = logging.getLogger("access")
POLICY_REFRESH = 30.0


def build(config: AccessConfig) -> tuple[ASGIApp, str]:
    life = Lifecycle()
    cluster = ClusterClient(config.clustermgr_hosts)
    redis = None
    if config.redis_url:
        import redis.asyncio as aioredis

        redis = aioredis.from_url(config.redis_url)
        life.close(redis.aclose)
    volumes = VolumeCache(cluster, config.volume_cache_ttl, redis)
    blobnodes = BlobnodeClient()
    allocator = AllocatorClient(config.allocator_hosts)
    mq = MqProxyClient(config.mqproxy_hosts, cluster)
    health = HealthTable(config.disk_punish, config.volume_punish, slow_after=config.hedge_after)
    store = ObjectStore(config, ShardIO(blobnodes, volumes, config.shard_timeout, health), volumes, allocator, mq)

    async def refresh_policy() -> None:
        while True:
            try:
                store.load_policy(await cluster.get_config(POLICY_KEY))
            except (RpcError, ValueError) as exc:
                log.warning("cannot load the code-mode policy: %s", exc)
            await asyncio.sleep(POLICY_REFRESH)

    life.loop(refresh_policy)
    life.close(cluster.close, blobnodes.close, allocator.close, mq.close)
    observers: list[metrics.Observer] = [count_bytes] if metrics.ENABLED else []
    if config.audit_log:
        audit = AuditLog(Path(config.audit_log), config.audit_log_max_bytes, config.audit_log_backups)
        observers.append(audit.write)
        life.close(lambda: asyncio.to_thread(audit.close))
    return build_app(store, life, observers), config.bind_addr


if __name__ == "__main__":
    run_service("access", AccessConfig, build)
