"""The blobnode's link to clustermgr: disk ids for new disks, registration, heartbeats (each disk's space, chunks,
trash, and whether its scrub keeps its period)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from blobstore_server.libs.proto.clustermgr import DiskAdd, DiskBeat
from blobstore_server.libs.rpc.errors import Conflict, RpcError
from blobstore_server.libs.rpc.server import Lifecycle
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.disk import read_format
from blobstore_server.services.blobnode.node import Blobnode
from blobstore_server.services.blobnode.scrubber import Scrubber
from blobstore_server.services.clustermgr.client import ClusterClient

log = logging.getLogger(__name__)


async def assign_disk_ids(config: BlobnodeConfig, cluster: ClusterClient) -> BlobnodeConfig:
    """A disk that is neither formatted nor given an id in the config gets one from clustermgr."""
    disks = []
    for disk in config.disks:
        formatted = (Path(disk.path) / ".sys" / "format.json").exists()
        if disk.disk_id is None and not formatted:
            disk = disk.model_copy(update={"disk_id": await cluster.alloc_disk_id()})
        elif disk.disk_id is None:
            disk = disk.model_copy(update={"disk_id": read_format(Path(disk.path)).disk_id})
        disks.append(disk)
    return config.model_copy(update={"disks": disks})


class ClusterLink:
    def __init__(self, node: Blobnode, cluster: ClusterClient, interval: float, scrubber: Scrubber) -> None:
        self.node = node
        self.cluster = cluster
        self.scrubber = scrubber
        self.interval = interval
        self.reported: set[int] = set()
        self.life = Lifecycle()
        self.life.loop(self._loop)
        self.life.close(cluster.close)

    async def register(self) -> None:
        config = self.node.config
        for disk_id, disk in self.node.disks.items():
            stat = await self.node.disk_stat(disk_id)
            info = DiskAdd(disk_id=disk_id, host=config.advertised_host, idc=config.idc, rack=config.rack,
                           hostname=config.hostname, path=str(disk.path), size=stat.size, free=stat.free,
                           max_chunks=disk.max_chunks)
            try:
                await self.cluster.add_disk(info)
            except Conflict:
                known = await self.cluster.get_disk(disk_id)
                if known.host != config.advertised_host or known.path != info.path:
                    raise RuntimeError(f"disk id {disk_id} is registered to {known.host}:{known.path}, "
                                       f"not this node's {info.path}") from None

    async def report_broken(self) -> None:
        """Tell clustermgr about every disk that failed too many system calls of late (once each)."""
        faults = self.node.faults
        for disk_id in faults.failing():
            if disk_id in self.reported:
                continue
            log.error("disk %d failed %d system calls within %.0f s (%d in all): reporting it broken", disk_id,
                      faults.threshold, faults.window, faults.totals[disk_id])
            try:
                await self.cluster.report_broken(disk_id)
            except Conflict as exc:  # not normal any more: broken already, or being dropped
                log.info("disk %d: %s", disk_id, exc)
            self.reported.add(disk_id)

    async def heartbeat(self) -> None:
        await self.report_broken()
        beats = []
        for disk_id in self.node.disks:
            stat = await self.node.disk_stat(disk_id)
            beats.append(DiskBeat(disk_id=disk_id, size=stat.size, free=stat.free, chunks=stat.chunks,
                                  trash_bytes=stat.trash_bytes, scrub_late_s=self.scrubber.stat(disk_id).late_s))
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        answer = await self.cluster.disk_heartbeat(beats)
        fence = self.node.write_fence
        shut = {d for d in self.node.disks if fence.refusal(d, loop.time()) is not None}
        fence.answered(sent_at, answer)
        for disk_id in self.node.disks:
            refused = fence.refusal(disk_id, loop.time())
            if (disk_id in shut) != (refused is not None):
                log.warning("disk %d %s", disk_id, refused or "takes writes again")

    async def _loop(self) -> None:
        """Register (retrying while clustermgr is away), then heartbeat every interval: on a fixed schedule, since
        clustermgr may hold a beat up to its batching window before answering."""
        registered = False
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                if not registered:
                    await self.register()
                    registered = True
                await self.heartbeat()
            except (RpcError, RuntimeError) as exc:
                log.warning("clustermgr %s failed: %s", "heartbeat" if registered else "registration", exc)
            await asyncio.sleep(max(0.0, started + self.interval - loop.time()))
