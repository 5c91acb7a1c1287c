"""What opening a chunk rebuilds: its index entries checked against the file, the shards a power cut left past the
watermark indexed again, the torn tail cut off (the durability rule: `chunk.py`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from isal.isal_zlib import crc32

from blobstore_server.libs.kv import KVStore

from . import format as fmt
from .errors import ShardCorrupted
from .index import ShardMeta, ShardStatus
from .reads import ShardReader


@dataclass(frozen=True)
class Recovered:
    end: int  # where the last shard ends: the chunk's write offset and watermark
    shards: list[ShardMeta]  # every shard the index now holds


def recover(reader: ShardReader, kv: KVStore, *, sync: bool) -> Recovered:
    """Drop entries past EOF; index again the complete shards past the watermark (their entries were lost with the
    index's unsynced tail); truncate the torn tail."""
    fd, index = reader.fds.fd, reader.index
    file_size = os.fstat(fd).st_size
    end = fmt.CHUNK_HEADER_SIZE
    shards: list[ShardMeta] = []
    batch = kv.batch()
    for meta in index.scan():
        phys = fmt.physical_size(meta.size)
        if meta.offset + phys > file_size or meta.offset < fmt.CHUNK_HEADER_SIZE:
            index.delete_into(batch, meta.bid)  # only possible if data was not synced (sync=False)
            continue
        shards.append(meta)
        end = max(end, meta.offset + phys)
    watermark = index.watermark()
    if watermark is not None:
        for meta in _found_past(reader, watermark, file_size).values():
            if index.get(meta.bid) is None:
                index.put_into(batch, meta)
                shards.append(meta)
                end = max(end, meta.offset + fmt.physical_size(meta.size))
    if file_size > end:  # cut first: a watermark at `end` must never have bytes of a deleted shard past it
        os.ftruncate(fd, end)
        if sync:
            os.fsync(fd)
    if batch.count or watermark != end:  # one synced batch: from here on the watermark holds
        index.watermark_into(batch, end)
        kv.write(batch)
    return Recovered(end, shards)


def _found_past(reader: ShardReader, start: int, file_size: int) -> dict[int, ShardMeta]:
    """The complete shards of this chunk starting at or past `start`, by bid (a bid found twice: the later one,
    a retried put; a record inside user bytes never counts, see `_shard_at`). Shards start 4 KiB aligned; a
    page that starts none (a put that failed, a torn one) is stepped over."""
    found: dict[int, ShardMeta] = {}
    pos = fmt.align_up(max(start, fmt.CHUNK_HEADER_SIZE))
    while pos + fmt.SHARD_HEADER_SIZE + fmt.SHARD_FOOTER_SIZE <= file_size:
        meta = _shard_at(reader, pos, file_size)
        if meta is None:
            pos += fmt.ALIGN
            continue
        found[meta.bid] = meta
        pos += fmt.physical_size(meta.size)
    return found


def _shard_at(reader: ShardReader, pos: int, file_size: int) -> ShardMeta | None:
    """The shard starting at `pos` if every part of it checks (header carrying this chunk's tag and naming its
    unit, each block's CRC, footer); else None. A torn put's payload may hold a complete record (user bytes):
    its tag is not the chunk's, which no user sees. A version-1 chunk has no tag (0, like any record a user
    makes): there only the unit tells, and a record of this unit in a torn put is not told from a shard."""
    fd = reader.fds.fd
    named = fmt.parse_shard_header(os.pread(fd, fmt.SHARD_HEADER_SIZE, pos))
    if named is None or pos + fmt.encoded_size(named.size) > file_size:
        return None
    bid, vuid, size, tag = named
    if tag != reader.tag or vuid >> 24 != reader.chunk_id.vuid >> 24:  # before reading it (`read_range` checks tags)
        return None
    crc = fmt.footer_crc(os.pread(fd, fmt.SHARD_FOOTER_SIZE, pos + fmt.footer_pos(size)))
    if crc is None:
        return None
    meta = ShardMeta(bid=bid, vuid=vuid, offset=pos, size=size, crc=crc, status=ShardStatus.NORMAL,
                     written_at=int(time.time()))
    try:
        data = reader.read_range(meta, 0, size)
    except ShardCorrupted:
        return None
    return meta if crc32(data) == crc else None
