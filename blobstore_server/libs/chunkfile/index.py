"""The shard index: one KV column family, key = chunk id (16 B) + bid (u64 big-endian).

Big-endian bids make a chunk's keys sort by bid, so listing is a range scan. The value is
the shard's physical offset, size, CRC, status and vuid, and (since value version 2) when it was
written and when it was marked deleted, in unix seconds: the offline inspection skips shards
written too recently (a PUT may still be under way) and finds deletes that were never purged.
Version-1 values still read, with both times 0 (unknown, i.e. old).

A second column family holds each chunk's watermark (key = chunk id, value = u64 file offset): every put whose
shard starts below it has settled, indexed (by the batch that writes the watermark or one before it) or failed.
It never goes down but on open, to where the file was cut off (nothing is past it). The group commit writes
shards' entries without syncing the index (the chunk bytes are synced): after a power cut, shards past the
watermark are found again in the chunk file itself (`ChunkFile.open`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.ids import ChunkId

SHARD_CF = "shard"
WATERMARK_CF = "watermark"

_BID = struct.Struct(">Q")
_OFFSET = struct.Struct("<Q")
_VALUE_V1 = struct.Struct("<BQIIBQ")  # value version, offset, size, crc, status, vuid
_VALUE = struct.Struct("<BQIIBQII")  # ... written at, marked deleted at (unix seconds, 0: unknown / not marked)
_VALUE_VERSION = 2
_MAX_BID = (1 << 64) - 1


def required_column_families() -> list[str]:
    """Column families the chunk file needs in the disk's KVStore."""
    return [SHARD_CF, WATERMARK_CF]


class ShardStatus(IntEnum):
    NORMAL = 1
    MARK_DELETED = 2


@dataclass(frozen=True)
class ShardMeta:
    bid: int
    vuid: int
    offset: int
    size: int
    crc: int
    status: ShardStatus
    written_at: int = 0
    marked_at: int = 0


def encode_value(meta: ShardMeta) -> bytes:
    return _VALUE.pack(_VALUE_VERSION, meta.offset, meta.size, meta.crc, int(meta.status), meta.vuid,
                       meta.written_at, meta.marked_at)


def decode_value(bid: int, raw: bytes) -> ShardMeta:
    version = raw[0] if raw else None
    if version == _VALUE_VERSION:
        _, offset, size, crc, status, vuid, written_at, marked_at = _VALUE.unpack(raw)
    elif version == 1:
        _, offset, size, crc, status, vuid = _VALUE_V1.unpack(raw)
        written_at = marked_at = 0
    else:
        raise ValueError(f"unknown shard index value version {version}")
    return ShardMeta(bid=bid, vuid=vuid, offset=offset, size=size, crc=crc, status=ShardStatus(status),
                     written_at=written_at, marked_at=marked_at)


def check_bid(bid: int) -> None:
    if not 0 <= bid <= _MAX_BID:
        raise ValueError(f"bid {bid} out of u64 range")


class ShardIndex:
    """One chunk's view of the shard column family."""

    def __init__(self, kv: KVStore, chunk_id: ChunkId) -> None:
        self.kv = kv
        self.chunk_id = chunk_id
        self.prefix = chunk_id.to_bytes()

    def key(self, bid: int) -> bytes:
        return self.prefix + _BID.pack(bid)

    def get(self, bid: int) -> ShardMeta | None:
        raw = self.kv.get(SHARD_CF, self.key(bid))
        return None if raw is None else decode_value(bid, raw)

    def put(self, meta: ShardMeta) -> None:
        self.kv.put(SHARD_CF, self.key(meta.bid), encode_value(meta))

    def put_into(self, batch: Batch, meta: ShardMeta) -> None:
        batch.put(SHARD_CF, self.key(meta.bid), encode_value(meta))

    def delete(self, bid: int) -> None:
        self.kv.delete(SHARD_CF, self.key(bid))

    def delete_into(self, batch: Batch, bid: int) -> None:
        batch.delete(SHARD_CF, self.key(bid))

    def watermark(self) -> int | None:
        """The chunk's watermark; None for a chunk whose every index write was synced (made before watermarks)."""
        raw = self.kv.get(WATERMARK_CF, self.prefix)
        return None if raw is None else int(_OFFSET.unpack(raw)[0])

    def watermark_into(self, batch: Batch, offset: int | None) -> None:
        """Set the watermark in `batch`; None drops it (a chunk left without shards)."""
        if offset is None:
            batch.delete(WATERMARK_CF, self.prefix)
        else:
            batch.put(WATERMARK_CF, self.prefix, _OFFSET.pack(offset))

    def scan(self, start_bid: int = 0) -> Iterator[ShardMeta]:
        """Entries with bid >= start_bid, in bid order."""
        start = self.key(max(0, start_bid)) if start_bid <= _MAX_BID else None
        if start is None:
            return
        for key, raw in self.kv.items(SHARD_CF, start):
            if not key.startswith(self.prefix):
                return
            yield decode_value(_BID.unpack_from(key, len(self.prefix))[0], raw)
