"""The blobnode's upkeep of its disks, the async shell of services/blobnode/trash.py and compaction.py: every
`upkeep_interval` seconds each disk removes the files of its `.trash/` whose hold is over, and, in a loop of its own,
compacts the one chunk the compaction rule picks, if any (one per disk at a time).

All of it runs on the disk's background threads, so user I/O never queues behind it. A compaction waits for one of
the disk's background slots and charges the bytes it moved against the disk's background rate
(`Blobnode.compact_chunk`). Removing trash moves no bytes and is what gives a filling disk its space back: it waits
neither for a slot nor for the rate (the bytes that repairs, moves and compactions charged would hold it back for
seconds, while their chunk files pile up in the trash), nor for a compaction; one cut at a time bounds what it costs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
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

    async def purging(self) -> None:
        await self._rounds("trash purge", self.purge)

    async def compacting(self) -> None:
        await self._rounds("compaction", self.compact)

    async def _rounds(self, what: str, round_: Callable[[float], Awaitable[None]]) -> None:
        """Round after round; a round that fails is logged and the next one tries again (a loop that died would
        leave the trash to grow unseen)."""
        while True:
            try:
                await round_(time.time())
            except (RpcError, OSError) as exc:
                log.warning("disk %d: %s round failed, trying again next round: %s", self.disk_id, what, exc)
            except Exception:
                log.exception("disk %d: %s round failed unexpectedly, trying again next round", self.disk_id, what)
            await asyncio.sleep(self.node.config.upkeep_interval)

    async def _on_background_threads(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.disk.background_executor,
                                                                functools.partial(fn, *args))

    async def _background(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the disk's background threads, holding one of its background slots."""
        async with self.node.background(self.disk_id, IOClass.BACKGROUND):
            return await self._on_background_threads(fn, *args)

    async def purge(self, now: float) -> None:
        """Remove every trash file whose hold is over, cut from its end `trash_purge_step` bytes a step."""
        config = self.node.config
        for entry in due(await self._on_background_threads(self.disk.trash), config.trash_hold, now):
            size = entry.size
            while True:
                size = next_cut(size, config.trash_purge_step)
                await self._on_background_threads(self.disk.cut_trash, entry.name, size)
                if not size:
                    break
            TRASH_PURGED.labels(self.label).inc(entry.disk_bytes)
            log.info("disk %d: purged %s from trash (%s, moved %.0f s ago, %d bytes on disk)", self.disk_id,
                     entry.chunk_id, entry.why or "named otherwise", now - entry.moved_at, entry.disk_bytes)

    async def compact(self, now: float) -> None:
        """Compact the chunk the rule picks, if any (and `auto_compact` is on)."""
        if not self.node.config.auto_compact:
            return
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
            self.life.loop(disk.purging)
            self.life.loop(disk.compacting)
