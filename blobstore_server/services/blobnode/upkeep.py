"""The blobnode's upkeep of its disks, the async shell of services/blobnode/trash.py and compaction.py: every
`upkeep_interval` seconds each disk removes the files of its `.trash/` whose hold is over, then compacts the one
chunk the compaction rule picks, if any (one per disk at a time).

All of it is background I/O of the disk: each step (a listing, a cut of a trash file, a compaction) waits for one of
the disk's background slots and runs on its background threads, so user I/O never queues behind it; a compaction
also charges the bytes it moved against the disk's background rate (`Blobnode.compact_chunk`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from blobstore_server.libs.proto.blobnode import IOClass
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.libs.rpc.server import Lifecycle
from blobstore_server.services.blobnode.compaction import CompactionPlan, CompactRule
from blobstore_server.services.blobnode.metrics import COMPACTED_GARBAGE, COMPACTIONS, TRASH_PURGED
from blobstore_server.services.blobnode.node import Blobnode
from blobstore_server.services.blobnode.trash import due, next_cut

T = TypeVar("T")
log = logging.getLogger(__name__)


class DiskUpkeep:
    """One disk's rounds."""

    def __init__(self, node: Blobnode, disk_id: int) -> None:
        self.node = node
        self.disk_id = disk_id
        self.disk = node.disk(disk_id)
        config = node.config
        self.plan = CompactionPlan(CompactRule(garbage_ratio=config.compact_garbage_ratio,
                                               min_garbage=config.compact_min_garbage, idle=config.compact_idle))
        self.label = str(disk_id)

    async def run(self) -> None:
        """Round after round; a round that fails is logged and the next one tries again (a loop that died would
        leave the trash to grow unseen)."""
        while True:
            try:
                await self.round(time.time())
            except (RpcError, OSError) as exc:
                log.warning("disk %d: upkeep round failed, trying again next round: %s", self.disk_id, exc)
            except Exception:
                log.exception("disk %d: upkeep round failed unexpectedly, trying again next round", self.disk_id)
            await asyncio.sleep(self.node.config.upkeep_interval)

    async def round(self, now: float) -> None:
        await self.purge(now)
        if self.node.config.auto_compact:
            await self.compact(now)

    async def _background(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the disk's background threads, holding one of its background slots."""
        async with self.node.background(self.disk_id, IOClass.BACKGROUND):
            return await asyncio.get_running_loop().run_in_executor(self.disk.background_executor,
                                                                    functools.partial(fn, *args))

    async def purge(self, now: float) -> None:
        """Remove every trash file whose hold is over, cut from its end `trash_purge_step` bytes a step."""
        config = self.node.config
        for entry in due(await self._background(self.disk.trash), config.trash_hold, now):
            size = entry.size
            while True:
                size = next_cut(size, config.trash_purge_step)
                await self._background(self.disk.cut_trash, entry.name, size)
                if not size:
                    break
            TRASH_PURGED.labels(self.label).inc(entry.disk_bytes)
            log.info("disk %d: purged %s from trash (%s, moved %.0f s ago, %d bytes on disk)", self.disk_id,
                     entry.chunk_id, entry.why or "named otherwise", now - entry.moved_at, entry.disk_bytes)

    async def compact(self, now: float) -> None:
        """Compact the chunk the rule picks, if any."""
        chunk = self.plan.next(await self._background(self.disk.chunk_stats), now)
        if chunk is None:
            return
        try:
            await self.node.compact_chunk(self.disk_id, chunk.vuid)
        except RpcError as exc:
            self.plan.failed(chunk.chunk_id, now)
            COMPACTIONS.labels(self.label, "error").inc()
            log.warning("disk %d: compaction of chunk %s failed, not tried again for %.0f s: %s", self.disk_id,
                        chunk.chunk_id, self.plan.rule.retry, exc)
            return
        COMPACTIONS.labels(self.label, "ok").inc()
        COMPACTED_GARBAGE.labels(self.label).inc(chunk.punched_bytes)
        log.info("disk %d: compacted chunk %s of vuid %d: %d bytes of garbage in %d used, %d live bytes copied",
                 self.disk_id, chunk.chunk_id, chunk.vuid, chunk.punched_bytes, chunk.write_offset,
                 chunk.physical_bytes)


class Upkeep:
    """Every disk's upkeep loop."""

    def __init__(self, node: Blobnode) -> None:
        self.disks = {disk_id: DiskUpkeep(node, disk_id) for disk_id in sorted(node.disks)}
        self.life = Lifecycle()
        for disk in self.disks.values():
            self.life.loop(disk.run)
