"""Damage a stored shard on disk, as bit rot or a buggy write would: behind its blobnode's back."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from isal.isal_zlib import crc32

from blobstore_server.libs.chunkfile.format import BLOCK_CRC_SIZE, BLOCK_SIZE, SHARD_HEADER_SIZE
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.services.blobnode.client import BlobnodeClient

FLIPPED_AT = 100  # the byte of the shard's first block that is flipped


async def locate(bn: BlobnodeClient, unit: Unit, bid: int) -> tuple[Path, int, int]:
    """(chunk file, offset of the shard in it, shard size), asked of the unit's blobnode."""
    shard = await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)
    chunk = next(c for c in await bn.list_chunks(unit.host, unit.disk_id) if c.vuid == unit.vuid)
    disk = await bn.disk_stat(unit.host, unit.disk_id)
    return Path(disk.path, "data", chunk.chunk_id), shard.offset, shard.size


def shard_on_disk(unit: Unit, bid: int) -> tuple[Path, int, int]:
    """`locate`, for a caller outside an event loop."""

    async def located() -> tuple[Path, int, int]:
        async with BlobnodeClient() as bn:
            return await locate(bn, unit, bid)

    return asyncio.run(located())


async def lose_shard(bn: BlobnodeClient, unit: Unit, bid: int) -> None:
    """Take a shard off its unit as a lost sector would: rot it behind its blobnode's back, then discard it as a
    repair does (a blobnode with auth discards a shard without a task's ticket only once it fails its checksums)."""
    flip_in_chunk(*await locate(bn, unit, bid))
    await bn.discard_shard(unit.host, unit.disk_id, unit.vuid, bid)


def flip_a_byte(unit: Unit, bid: int, keep_crc: bool = False) -> None:
    """Invert one byte of the shard's first block; with `keep_crc` the block's CRC is rewritten to match, so only
    the stripe's parity can tell."""
    flip_in_chunk(*shard_on_disk(unit, bid), keep_crc=keep_crc)


def flip_in_chunk(path: Path, offset: int, size: int, keep_crc: bool = False) -> None:
    """`flip_a_byte` on the shard at `offset` (of `size` bytes) of the chunk file at `path`."""
    crc_at = offset + SHARD_HEADER_SIZE
    block_at = crc_at + BLOCK_CRC_SIZE
    with open(path, "r+b") as f:
        f.seek(block_at)
        block = bytearray(f.read(min(size, BLOCK_SIZE)))
        block[FLIPPED_AT] ^= 0xFF
        f.seek(block_at)
        f.write(block)
        if keep_crc:
            f.seek(crc_at)
            f.write(struct.pack("<I", crc32(block)))
