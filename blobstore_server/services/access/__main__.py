"""`python -m blobstore_server.services.access -c access.json`"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from blobstore_server.libs.proto.access import ROUTES
from blobstore_server.libs.proto.clustermgr import POLICY_KEY
from blobstore_server.libs.rpc import metrics
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.libs.rpc.server import ASGIApp, Lifecycle, run_service
from blobstore_server.services.access.app import build_app
from blobstore_server.services.access.audit import AuditLog
from blobstore_server.services.access.blobs import ShardIO
from blobstore_server.services.access.config import AccessConfig
from blobstore_server.services.access.health import HealthTable
from blobstore_server.services.access.metrics import count_bytes
from blobstore_server.services.access.objects import ObjectStore
from blobstore_server.services.access.outbox import Outbox
from blobstore_server.services.access.region import Region
from blobstore_server.services.access.statefile import StateFile, StateFileInUse
from blobstore_server.services.access.tail import TailDelay
from blobstore_server.services.allocator.client import AllocatorClient
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient, VolumeCache
from blobstore_server.services.mqproxy.client import MqProxyClient

log = logging.getLogger("access")
POLICY_REFRESH = 30.0
OUTBOX_LAST_FLUSH = 5.0


def _policy_loop(store: ObjectStore, cluster: ClusterClient) -> Callable[[], Coroutine[Any, Any, None]]:
    """Follow the code-mode policy the cluster's clustermgr publishes."""
    async def refresh_policy() -> None:
        while True:
            try:
                store.load_policy(await cluster.get_config(POLICY_KEY))
            except (RpcError, ValueError) as exc:
                log.warning("cluster %d: cannot load the code-mode policy: %s", store.cluster_id, exc)
            await asyncio.sleep(POLICY_REFRESH)

    return refresh_policy


def _standby_loop(store: ObjectStore, interval: float) -> Callable[[], Coroutine[Any, Any, None]]:
    """Keep the stock that rides out an allocator outage (standby.py) filled."""
    async def refill_standby() -> None:
        while True:
            try:
                await store.refill_standby()
            except Exception:  # the loop must outlive any one failure: PUTs depend on it in an outage
                log.exception("cluster %d: refilling the standby stock failed", store.cluster_id)
            await asyncio.sleep(interval)

    return refill_standby


async def _last_flush(outbox: Outbox) -> None:
    """At shutdown: a few seconds to hand over what the outbox holds."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(outbox.flush(), OUTBOX_LAST_FLUSH)


def build(config: AccessConfig) -> tuple[ASGIApp, str]:
    try:
        state = StateFile(Path(config.state_file))
    except StateFileInUse as exc:
        sys.exit(f"access: refusing to start: {exc}")
    life = Lifecycle()
    redis = None
    if config.redis_url:
        import redis.asyncio as aioredis

        tls = {"ssl_ca_certs": config.redis_ca_file} if config.redis_ca_file else {}  # plain redis:// takes none
        redis = aioredis.from_url(config.redis_url, socket_timeout=config.redis_timeout,
                                   socket_connect_timeout=config.redis_timeout, **tls)
        life.close(redis.aclose)
    blobnodes = BlobnodeClient(in_flight=config.shard_calls_in_flight)
    life.close(blobnodes.close)
    stores, managers = {}, {}
    for hosts in config.clusters():
        cluster = ClusterClient(hosts.clustermgr_hosts)
        volumes = VolumeCache(cluster, config.volume_cache_ttl, redis, hosts.cluster_id)
        allocator = AllocatorClient(hosts.allocator_hosts, attempt_timeout=config.allocator_timeout,
                                    punish=config.allocator_punish)
        intents = config.auth.intents(hosts.cluster_id) if config.auth is not None else None
        mq = MqProxyClient(hosts.mqproxy_hosts, cluster, intents=intents)
        # Volume and disk ids are per cluster: so is what failed lately.
        health = HealthTable(config.disk_punish, config.volume_punish, slow_after=config.hedge_after)
        tail = TailDelay(config.tail_hedge_quantile, config.tail_hedge_min) if config.tail_hedge_quantile else None
        io = ShardIO(blobnodes, volumes, config.shard_timeout, health, config.put_grace, tail, config.tail_hedge_bytes,
                     allocator.volume_full)
        store = stores[hosts.cluster_id] = ObjectStore(config, io, volumes, allocator, state, mq, hosts.cluster_id)
        if store.outbox is not None:
            life.loop(store.outbox.run)
            life.close(partial(_last_flush, store.outbox))
        managers[hosts.cluster_id] = cluster
        life.loop(_policy_loop(stores[hosts.cluster_id], cluster))
        if config.standby_ride_out > 0:
            life.loop(_standby_loop(stores[hosts.cluster_id], config.standby_refill))
        life.close(cluster.close, allocator.close, mq.close)
    unclaimed = state.unclaimed()
    if unclaimed:
        log.error("state file %s holds messages or grants of clusters %s, which this node no longer serves: left "
                  "in it", config.state_file, unclaimed)
    region = Region(stores, managers, config.secret.encode())

    async def refresh_region() -> None:
        while True:
            await region.refresh()
            await asyncio.sleep(config.region_refresh)

    if len(stores) > 1:
        life.loop(refresh_region)
    observers: list[metrics.Observer] = [count_bytes] if metrics.ENABLED else []
    if config.audit_log:
        audit = AuditLog(Path(config.audit_log), config.audit_log_max_bytes, config.audit_log_backups)
        observers.append(audit.write)
        life.close(lambda: asyncio.to_thread(audit.close))
    life.close(lambda: asyncio.to_thread(state.close))  # after the outboxes' last flush
    return build_app(region, life, observers), config.bind_addr


if __name__ == "__main__":
    run_service("access", AccessConfig, build, routes=ROUTES, public=True)
