"""The allocator's async shell: keeps the pool leased, renewed and stocked with bids.

Disk health comes with every lease renewal: clustermgr answers each retained volume with whether all its
units are on live, in-service disks (one judgement, clustermgr's, from the heartbeats it records), so the
pool stops preferring a volume within one retain interval of clustermgr declaring its disk dead, and takes
it back as soon as the disk heartbeats again. The lease is kept meanwhile: such a volume is still the
fallback when no writable one is left (every volume of a 6-host EC3P3 cluster has a unit on a dead host).
A restarted allocator first takes back the leases its previous run held (`reclaim`): otherwise it would have
nothing to allocate from until they lapsed, when clustermgr keeps no spare volumes.

A volume access reports full (a blobnode answered ChunkFull for one of its shards) leaves the pool at once and is
reported to clustermgr right after the answer, and again every retain interval until clustermgr took it: clustermgr
ends its lease, so the allocator that holds it drops it at its next renewal, and no allocator leases it again.
Never inside the allocation: an allocation must not wait on clustermgr.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.allocator import AllocatorStat, BlobSlice, LeasedVolume, UnusedSpace
from blobstore_server.libs.proto.clustermgr import RetainItem, VolumeView
from blobstore_server.libs.rpc.errors import NotFound, RpcError, Unavailable
from blobstore_server.libs.rpc.server import Lifecycle
from blobstore_server.services.allocator.config import AllocatorConfig
from blobstore_server.services.allocator.pool import PoolEmpty, VolumePool
from blobstore_server.services.clustermgr.client import ClusterClient

log = logging.getLogger(__name__)
LEASE_RETRY = 1.0  # seconds: after clustermgr had fewer volumes to lease than asked, ask again no sooner


def _leased(volume: VolumeView, lease_until: float) -> LeasedVolume:
    return LeasedVolume(vid=volume.vid, code_mode=volume.code_mode, capacity=volume.capacity, used=volume.used,
                        lease_until=lease_until, disks=[u.disk_id for u in volume.units],
                        hosts=[u.host for u in volume.units], under_spread=volume.under_spread,
                        writable=volume.writable, why_not=volume.why_not, down_units=volume.down_units)


class Allocator:
    def __init__(self, config: AllocatorConfig, cluster: ClusterClient | None = None) -> None:
        self.config = config
        self.holder = config.advertised_host
        self.cluster = cluster or ClusterClient(config.clustermgr_hosts)
        self.modes = config.code_modes
        self.pool = VolumePool(config.lease_margin)
        self._lock = asyncio.Lock()  # one refill at a time
        self._short_until: dict[CodeMode, float] = {}  # clustermgr had no more volumes of the mode until then
        self._leased_modes: set[CodeMode] = set()  # leased before by this process: nothing left to reclaim
        self._full: set[int] = set()  # vids found full (by access, or by this pool), not yet taken by clustermgr
        self._largest_blob: dict[CodeMode, int] = {}  # per mode: a volume without room for one is full
        self._full_reported = asyncio.Event()
        self.life = Lifecycle()
        self.life.loop(lambda: self._every(config.retain_interval, self.retain))
        self.life.loop(lambda: self._every(config.refill_interval, self.refill))
        self.life.loop(self._report_full)
        self.life.close(self.cluster.close)

    @staticmethod
    async def _every(interval: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await job()
            except RpcError as exc:
                log.warning("%s failed: %s", getattr(job, "__name__", job), exc)
            await asyncio.sleep(interval)

    async def refill(self, mode: CodeMode | None = None, bids_wanted: int = 0, extra: int = 0,
                     avoid_disks: Sequence[int] = ()) -> None:
        """Lease volumes until each mode has enough usable ones (and `extra` more, within the cap);
        fetch bids when running low."""
        async with self._lock:
            now = time.monotonic()
            for m in [mode] if mode is not None else self.modes:
                held = len(self.pool.usable(m, now))
                missing = min(self.pool.wanted(m, now, self.config.volumes_per_mode) + extra,
                              self.config.max_volumes_per_mode - held)
                if missing > 0 and now >= self._short_until.get(m, 0.0):
                    asked_at = time.monotonic()  # the leases begin later: counted from here, they end no later
                    leased = await self.cluster.alloc_volumes(m, self.holder, missing, avoid_disks,
                                                              reclaim=m not in self._leased_modes,
                                                              largest_blob=self._largest_blob.get(m, 1))
                    self._leased_modes.add(m)
                    for volume in leased.volumes:
                        self.pool.add(_leased(volume, asked_at + leased.lease_for))
                    if len(leased.volumes) < missing:  # clustermgr has no more to give: not again on every request
                        self._short_until[m] = now + LEASE_RETRY
            if self.pool.bids.left < max(self.config.bid_batch // 2, bids_wanted):
                got = await self.cluster.alloc_scope("bid", max(self.config.bid_batch, bids_wanted))
                self.pool.bids.add(got.start, got.end)

    async def retain(self) -> None:
        """Renew every lease; a refused one (lapsed, or taken away) leaves the pool at once."""
        if not self.pool.volumes:
            return
        items = [RetainItem(vid=v.vid, used=v.used) for v in self.pool.volumes.values()]
        asked_at = time.monotonic()
        answer = await self.cluster.retain_volumes(self.holder, items)
        for kept in answer.retained:
            self.pool.renewed(kept.vid, asked_at + answer.lease_for, kept)
        for refused in answer.refused:
            log.warning("volume %s left the pool: %s", refused.vid, refused.reason)
            self.pool.drop(refused.vid)

    async def _report_full(self) -> None:
        """Tell clustermgr the volumes access found full, at once and again until it took them."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full_reported.wait(), self.config.retain_interval)
            self._full_reported.clear()
            for vid in sorted(self._full):
                try:
                    await self.cluster.volume_full(vid)
                    log.info("volume %d is full: retired from allocation", vid)
                except NotFound:
                    log.warning("access reported volume %d full, which clustermgr does not know", vid)
                except RpcError as exc:
                    log.warning("cannot report volume %d full yet: %s", vid, exc)
                    continue
                self._full.discard(vid)

    def volumes_full(self, vids: Sequence[int]) -> None:
        """Volumes a blobnode answered ChunkFull for, or left without room for the largest blob: out of the pool
        now, and reported to clustermgr."""
        for vid in vids:
            self.pool.drop(vid)
            self._full.add(vid)
        if vids:
            self._full_reported.set()

    async def allocate(self, code_mode: CodeMode, size: int, blob_size: int, exclude_vids: Sequence[int] = (),
                       avoid_disks: Sequence[int] = (), bids: int | None = None,
                       returned: Sequence[UnusedSpace] = ()) -> list[BlobSlice]:
        """Space in the best volume for access (see pool.py); when none fits, lease another one first.
        Space `returned` unused by earlier allocations is given back first."""
        for unused in returned:
            self.pool.give_back(unused.vid, unused.size, unused.bids)
        excluded, avoided = set(exclude_vids), set(avoid_disks)
        largest = self._largest_blob[code_mode] = max(self._largest_blob.get(code_mode, 1), min(size, blob_size))
        for attempt in range(3):
            try:
                granted = self.pool.allocate(code_mode, size, blob_size, time.monotonic(), excluded, avoided,
                                             bids)
            except PoolEmpty as exc:
                if attempt == 2:
                    raise Unavailable(f"cannot allocate {size} bytes of {code_mode.name}: {exc}") from None
                # clustermgr had none a moment ago: ask once the pause is over (it makes more). Not when avoiding
                # disks: the refill asks at once for a volume clear of them, which clustermgr makes then and there,
                # and the access node gives an allocator only its attempt_timeout (1 s) before passing it over.
                if exc.no_volume and not avoided:
                    await asyncio.sleep(max(0.0, self._short_until.get(code_mode, 0.0) - time.monotonic()))
                await self.refill(code_mode, bids_wanted=max(-(-size // blob_size), bids or 0),
                                  extra=int(exc.no_volume), avoid_disks=avoid_disks)
                continue
            vid = granted[0].vid
            if space.is_full(code_mode, self.pool.volumes[vid].free, largest):
                self.volumes_full([vid])  # not held on for small objects only: a fresh volume takes its place
            return granted
        raise AssertionError("unreachable")

    def stat(self) -> AllocatorStat:
        return AllocatorStat(holder=self.holder, now=time.monotonic(), bids_left=self.pool.bids.left,
                             volumes=list(self.pool.volumes.values()))
