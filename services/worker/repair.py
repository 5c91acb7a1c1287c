"""Shard repair: rebuild the missing or corrupt shards of one blob from its survivors and write
each back to its own unit.

Never resurrects a deleted blob: if any shard of the blob is mark-deleted, or no survivor holds it
at all, the repair is skipped (the delete pipeline owns it). A corrupt shard is deleted before
its rebuilt bytes are written (the chunk refuses other bytes under a live bid), and every
written shard is read back and checked against the rebuilt bytes' CRC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from isal import isal_zlib

from libs.ec import Codec, NotEnoughShards
from libs.proto.cluster import Unit, VolumeInfo
from libs.rpc.errors import NotFound, RpcError, ShardCorrupted, ShardDeleted, ShardNotFound, Unavailable
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient

log = logging.getLogger(__name__)


@dataclass
class RepairResult:
    vid: int
    bid: int
    repaired: list[int] = field(default_factory=list)
    skipped: str = ""  # why nothing was written, when nothing needed to be or could be


class RepairFailed(Unavailable):
    """Too few good shards to rebuild from now; the caller retries later."""


class ShardRepairer:
    def __init__(self, cluster: ClusterClient, blobnodes: BlobnodeClient, timeout: float) -> None:
        self.cluster = cluster
        self.blobnodes = blobnodes
        self.timeout = timeout
        self._codecs: dict[tuple[int, str], Codec] = {}
        self.stats = {"repaired_shards": 0, "repaired_bytes": 0, "skipped": 0, "failed": 0}

    def _codec(self, volume: VolumeInfo) -> Codec:
        key = (volume.code_mode, volume.backend)
        if key not in self._codecs:
            self._codecs[key] = Codec(volume.code_mode, volume.backend)
        return self._codecs[key]

    async def _read(self, unit: Unit, bid: int) -> bytes | RpcError:
        try:
            return await self.blobnodes.get_shard(unit.host, unit.disk_id, unit.vuid, bid, timeout=self.timeout)
        except RpcError as exc:
            return exc

    async def repair(self, vid: int, bid: int, bad_indexes: list[int]) -> RepairResult:
        try:
            result = await self._repair(vid, bid, set(bad_indexes))
        except RpcError:
            self.stats["failed"] += 1
            raise
        self.stats["repaired_shards"] += len(result.repaired)
        self.stats["skipped"] += bool(result.skipped)
        return result

    async def _repair(self, vid: int, bid: int, bad: set[int]) -> RepairResult:
        volume = await self.cluster.get_volume(vid)  # fresh: units may have moved since the report
        codec = self._codec(volume)
        if not bad <= set(range(codec.tactic.total)):
            raise RepairFailed(f"volume {vid} has no shard index in {sorted(bad)}")
        reads = await asyncio.gather(*(self._read(unit, bid) for unit in volume.units))
        if any(isinstance(r, ShardDeleted) for r in reads):
            return RepairResult(vid, bid, skipped="the blob is being deleted")
        if all(isinstance(r, ShardNotFound) for i, r in enumerate(reads) if i not in bad):
            return RepairResult(vid, bid, skipped="no shard of the blob exists")
        shards: list[bytes | None] = [None if i in bad or isinstance(r, RpcError) else r for i, r in enumerate(reads)]
        # Survivors that turned out missing or corrupt are repaired too; unreachable ones are not ours to judge.
        wanted = sorted(bad | {i for i, r in enumerate(reads) if isinstance(r, ShardNotFound | ShardCorrupted)})
        try:
            rebuilt = await asyncio.to_thread(codec.reconstruct, shards, wanted)
        except NotEnoughShards as exc:
            raise RepairFailed(f"blob {vid}/{bid}: {exc}") from None
        result = RepairResult(vid, bid)
        for index in wanted:
            if await self._write(volume.units[index], bid, bytes(rebuilt[index])):
                result.repaired.append(index)
                self.stats["repaired_bytes"] += len(rebuilt[index])
            else:
                return RepairResult(vid, bid, repaired=result.repaired, skipped="the blob is being deleted")
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
        if not isinstance(current, ShardNotFound):  # corrupt, or other bytes: make room for the right ones
            with contextlib.suppress(NotFound):
                await self.blobnodes.delete_shard(host, disk, vuid, bid)
        crc = await self.blobnodes.put_shard(host, disk, vuid, bid, data, timeout=self.timeout)
        if crc != isal_zlib.crc32(data) or await self._read(unit, bid) != data:
            raise RepairFailed(f"shard {bid} on disk {disk} did not read back as written")
        return True
