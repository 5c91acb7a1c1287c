"""Shard repair: rebuild the missing or corrupt shards of one blob from its survivors and write
each back to its own unit (what to rebuild, and when not to, is `rules.plan_repair`).

A corrupt shard is discarded before its rebuilt bytes are written (the chunk refuses other bytes under
a live bid), and every written shard is read back and checked against the rebuilt bytes' CRC. The blobnode
takes that discard, which names no task, only for a shard failing its checksums (libs/rpc/tickets.py): other
bytes under a good CRC stay, and their repair fails (403 ticket_refused) for an operator to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from isal import isal_zlib

from blobstore_server.libs.ec import codec_for
from blobstore_server.libs.proto.blobnode import IOClass, shard_state
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.worker import RepairResult, WorkerStats
from blobstore_server.libs.rpc.client import Payload
from blobstore_server.libs.rpc.errors import NotFound, RpcError, ShardDeleted, ShardNotFound
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.worker.rebuild import RepairFailed, rebuild_shards
from blobstore_server.services.worker.rules import plan_repair

log = logging.getLogger(__name__)
BACKGROUND = IOClass.BACKGROUND


class ShardRepairer:
    def __init__(self, cluster: ClusterClient, blobnodes: BlobnodeClient, timeout: float) -> None:
        self.cluster = cluster
        self.blobnodes = blobnodes
        self.timeout = timeout
        self.stats = WorkerStats()

    async def _read(self, unit: Unit, bid: int) -> Payload | RpcError:
        try:
            return await self.blobnodes.get_shard(unit.host, unit.disk_id, unit.vuid, bid, timeout=self.timeout,
                                                  io_class=BACKGROUND)
        except RpcError as exc:
            return exc

    async def repair(self, vid: int, bid: int, bad_indexes: list[int]) -> RepairResult:
        try:
            result = await self._repair(vid, bid, set(bad_indexes))
        except RpcError:
            self.stats.failed += 1
            raise
        self.stats.repaired_shards += len(result.repaired)
        self.stats.skipped += bool(result.skipped)
        return result

    async def _repair(self, vid: int, bid: int, bad: set[int]) -> RepairResult:
        volume = await self.cluster.get_volume(vid)  # fresh: units may have moved since the report
        codec = codec_for(volume.code_mode, volume.backend)
        reads = await asyncio.gather(*(self._read(unit, bid) for unit in volume.units))
        try:
            plan = plan_repair(bad, [shard_state(r) for r in reads])
        except ValueError as exc:
            raise RepairFailed(f"volume {vid}: {exc}") from None
        if plan.skip:
            return RepairResult(vid=vid, bid=bid, skipped=plan.skip)
        survivors = {i: r for i, r in enumerate(reads) if not isinstance(r, RpcError)}
        try:
            rebuilt = await rebuild_shards(codec, lambda i: self._read(volume.units[i], bid), plan.sources,
                                           plan.rebuild, have=survivors)
        except RepairFailed as exc:
            raise RepairFailed(f"blob {vid}/{bid}: {exc}") from None
        result = RepairResult(vid=vid, bid=bid)
        for index in plan.rebuild:
            if not await self._write(volume.units[index], bid, rebuilt[index]):
                result.skipped = "the blob is being deleted"
                return result
            result.repaired.append(index)
            self.stats.repaired_bytes += len(rebuilt[index])
        log.info("repaired blob %d/%d shards %s", vid, bid, result.repaired)
        return result

    async def _write(self, unit: Unit, bid: int, data: bytes) -> bool:
        """Replace one shard with its rebuilt bytes; False if it turned out mark-deleted."""
        host, disk, vuid = unit.host, unit.disk_id, unit.vuid
        current = await self._read(unit, bid)
        if current == data:
            return True
        if isinstance(current, ShardDeleted):
            return False
        if not isinstance(current, ShardNotFound):  # corrupt (or other bytes: refused), make room for the right ones
            with contextlib.suppress(NotFound):
                await self.blobnodes.discard_shard(host, disk, vuid, bid, io_class=BACKGROUND)
        crc = await self.blobnodes.put_shard(host, disk, vuid, bid, data, timeout=self.timeout, io_class=BACKGROUND)
        if crc != isal_zlib.crc32(data) or await self._read(unit, bid) != data:
            raise RepairFailed(f"shard {bid} on disk {disk} did not read back as written")
        return True
