"""The allocator's async shell: keeps the pool leased, renewed and stocked with bids."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from libs.ec import CodeMode, parse_code_mode
from libs.proto.allocator import AllocatorStat, BlobSlice, LeasedVolume
from libs.proto.cluster import VolumeInfo
from libs.proto.clustermgr import RetainItem
from libs.rpc.errors import RpcError, Unavailable
from libs.rpc.server import Lifecycle
from services.allocator.config import AllocatorConfig
from services.allocator.pool import PoolEmpty, VolumePool
from services.clustermgr.client import ClusterClient

log = logging.getLogger(__name__)


def _leased(volume: VolumeInfo) -> LeasedVolume:
    return LeasedVolume(vid=volume.vid, code_mode=volume.code_mode, capacity=volume.capacity, used=volume.used,
                        lease_expiry=volume.lease_expiry)


class Allocator:
    def __init__(self, config: AllocatorConfig, cluster: ClusterClient | None = None) -> None:
        self.config = config
        self.holder = config.advertised_host
        self.cluster = cluster or ClusterClient(config.clustermgr_hosts)
        self.modes = [parse_code_mode(m) for m in config.code_modes]
        self.pool = VolumePool(config.lease_margin)
        self._lock = asyncio.Lock()  # one refill at a time
        self.life = Lifecycle()
        self.life.loop(lambda: self._every(config.retain_interval, self.retain))
        self.life.loop(lambda: self._every(config.refill_interval, self.refill))
        self.life.close(self.cluster.close)

    @staticmethod
    async def _every(interval: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await job()
            except RpcError as exc:
                log.warning("%s failed: %s", getattr(job, "__name__", job), exc)
            await asyncio.sleep(interval)

    async def refill(self, mode: CodeMode | None = None, bids_wanted: int = 0) -> None:
        """Lease volumes until each mode has enough usable ones; fetch bids when running low."""
        async with self._lock:
            now = time.time()
            for m in [mode] if mode is not None else self.modes:
                missing = self.config.volumes_per_mode - len(self.pool.usable(int(m), now))
                if missing > 0:
                    for volume in await self.cluster.alloc_volumes(int(m), self.holder, missing):
                        self.pool.add(_leased(volume))
            if self.pool.bids.left < max(self.config.bid_batch // 2, bids_wanted):
                got = await self.cluster.alloc_scope("bid", max(self.config.bid_batch, bids_wanted))
                self.pool.bids.add(got.start, got.end)

    async def retain(self) -> None:
        """Renew every lease; a refused one (lapsed, or taken away) leaves the pool at once."""
        if not self.pool.volumes:
            return
        items = [RetainItem(vid=v.vid, used=v.used) for v in self.pool.volumes.values()]
        answer = await self.cluster.retain_volumes(self.holder, items)
        for kept in answer.retained:
            self.pool.renewed(kept.vid, kept.lease_expiry)
        for refused in answer.refused:
            log.warning("volume %s left the pool: %s", refused.vid, refused.reason)
            self.pool.drop(refused.vid)

    async def allocate(self, code_mode: CodeMode, size: int, blob_size: int) -> list[BlobSlice]:
        for attempt in range(3):
            try:
                return self.pool.allocate(int(code_mode), size, blob_size, time.time())
            except PoolEmpty as exc:
                if attempt == 2:
                    raise Unavailable(f"cannot allocate {size} bytes of {code_mode.name}: {exc}") from None
                await self.refill(code_mode, bids_wanted=-(-size // blob_size))
        raise AssertionError("unreachable")

    def stat(self) -> AllocatorStat:
        return AllocatorStat(holder=self.holder, bids_left=self.pool.bids.left,
                             volumes=list(self.pool.volumes.values()))
