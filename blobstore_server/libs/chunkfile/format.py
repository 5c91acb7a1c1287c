"""Byte layout of a chunk file: the chunk header, shard header/blocks/footer, and their CRCs.

Everything here is pure (no I/O) so the layout can be tested on its own.

    chunk file: | chunk header (4 KiB) | shard | shard | ... |   every shard starts 4 KiB aligned
    shard:      | header 32 B | crc 4 B | block <= 64 KiB | crc | block | ... | footer 8 B | pad |

All integers are little-endian. CRCs are IEEE CRC32 (isal, zlib-compatible).

The chunk's tag (format version 2) is a random u32 drawn when the chunk is made, kept in its header and written
into every shard header of the chunk. A shard record found by scanning the file (after a power cut, `ChunkFile.open`)
counts only if it carries the tag: a user's bytes can hold a complete record (data shards are plain slices of the
user's blob), but not one with a tag nobody outside the disk ever sees. A version-1 chunk has no tag: its records
carry 0 there (the header's padding, then), as do the ones it takes still.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from typing import NamedTuple

from isal.isal_zlib import crc32

from blobstore_server.libs.proto.ids import CHUNK_ID_SIZE, ChunkId

from .errors import ChunkCorrupted, ShardCorrupted

ALIGN = 4096
CHUNK_HEADER_SIZE = 4096
BLOCK_SIZE = 64 * 1024
BLOCK_CRC_SIZE = 4
FORMAT_VERSION = 2
UNTAGGED_VERSION = 1  # chunks made before the tag: read, written and recovered with tag 0

CHUNK_MAGIC = b"BSCK"
SHARD_MAGIC = 0x5348_4244  # "DBHS" little-endian: shard header
FOOTER_MAGIC = 0x5446_4453  # "SDFT" little-endian: shard footer

# magic, version, parent chunk id, ctime (ns), then (from version 2) the tag; the CRC of these bytes follows.
_CHUNK_HEADER = struct.Struct(f"<4sB{CHUNK_ID_SIZE}sq")
_TAG = struct.Struct("<I")
_CRC = struct.Struct("<I")
# header crc, magic, bid, vuid, size, the chunk's tag (version 1: padding, 0); the crc covers bytes [4:32).
_SHARD_HEADER = struct.Struct("<IIQQII")
_FOOTER = struct.Struct("<II")
SHARD_HEADER_SIZE = _SHARD_HEADER.size
SHARD_FOOTER_SIZE = _FOOTER.size
MAX_SHARD_SIZE = (1 << 32) - 1
MAX_TAG = (1 << 32) - 1

ZERO_PAGE = memoryview(bytes(ALIGN))

assert SHARD_HEADER_SIZE == 32 and SHARD_FOOTER_SIZE == 8


def align_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def block_count(size: int) -> int:
    return (size + BLOCK_SIZE - 1) // BLOCK_SIZE


def block_len(size: int, i: int) -> int:
    """Data bytes in block i of a shard of `size` bytes."""
    return min(BLOCK_SIZE, size - i * BLOCK_SIZE)


def block_pos(i: int) -> int:
    """Offset of block i's CRC, relative to the start of the shard."""
    return SHARD_HEADER_SIZE + i * (BLOCK_SIZE + BLOCK_CRC_SIZE)


def footer_pos(size: int) -> int:
    """Offset of the footer, relative to the start of the shard."""
    return SHARD_HEADER_SIZE + size + BLOCK_CRC_SIZE * block_count(size)


def encoded_size(size: int) -> int:
    """Bytes a shard occupies before alignment padding."""
    return footer_pos(size) + SHARD_FOOTER_SIZE


def physical_size(size: int) -> int:
    """Bytes a shard occupies in the file, 4 KiB aligned so holes can be punched per shard."""
    return align_up(encoded_size(size))


# ---------------------------------------------------------------- chunk header


def new_tag() -> int:
    """A fresh chunk's tag: random, never 0 (what the records of a version-1 chunk carry, and anyone can write)."""
    return 1 + secrets.randbelow(MAX_TAG)


@dataclass(frozen=True)
class ChunkHeader:
    parent: ChunkId | None
    ctime: int
    tag: int  # 0 exactly in a version-1 chunk
    version: int = FORMAT_VERSION

    def pack(self) -> bytes:
        parent = (self.parent or ChunkId(0, 0)).to_bytes()
        body = _CHUNK_HEADER.pack(CHUNK_MAGIC, self.version, parent, self.ctime)
        if self.version != UNTAGGED_VERSION:
            body += _TAG.pack(self.tag)
        raw = body + _CRC.pack(crc32(body))
        return raw + bytes(CHUNK_HEADER_SIZE - len(raw))

    @classmethod
    def unpack(cls, raw: bytes) -> ChunkHeader:
        if len(raw) < _CHUNK_HEADER.size:
            raise ChunkCorrupted(f"chunk header truncated: {len(raw)} bytes")
        magic, version, parent, ctime = _CHUNK_HEADER.unpack_from(raw)
        if magic != CHUNK_MAGIC:
            raise ChunkCorrupted(f"bad chunk magic {magic!r}")
        if version not in (UNTAGGED_VERSION, FORMAT_VERSION):
            raise ChunkCorrupted(f"unsupported chunk format version {version}")
        tagged = version != UNTAGGED_VERSION
        end = _CHUNK_HEADER.size + (_TAG.size if tagged else 0)
        if len(raw) < end + _CRC.size:
            raise ChunkCorrupted(f"chunk header truncated: {len(raw)} bytes")
        (stored,) = _CRC.unpack_from(raw, end)
        if stored != crc32(raw[:end]):
            raise ChunkCorrupted("chunk header crc mismatch")
        tag = _TAG.unpack_from(raw, _CHUNK_HEADER.size)[0] if tagged else 0
        if tagged and tag == 0:  # never written so: 0 would let records anyone can make pass
            raise ChunkCorrupted(f"chunk format version {version} without a tag")
        pid = ChunkId.from_bytes(parent)
        return cls(parent=None if pid.is_zero else pid, ctime=ctime, tag=tag, version=version)


# ---------------------------------------------------------------- shard framing


class ShardHeader(NamedTuple):
    """What a shard header says, past its CRC and magic."""

    bid: int
    vuid: int
    size: int
    tag: int  # the tag of the chunk the record was written for


def pack_shard_header(bid: int, vuid: int, size: int, tag: int) -> bytes:
    body = _SHARD_HEADER.pack(0, SHARD_MAGIC, bid, vuid, size, tag)
    return _CRC.pack(crc32(memoryview(body)[4:])) + body[4:]


def _header_fields(raw: memoryview | bytes) -> tuple[int, ...] | None:
    """(bid, vuid, size, tag) of a valid shard header; None for any other bytes (too few, a wrong magic or CRC)."""
    if len(raw) < SHARD_HEADER_SIZE:
        return None
    fields = _SHARD_HEADER.unpack_from(raw)
    if fields[1] != SHARD_MAGIC or fields[0] != crc32(memoryview(raw)[4:SHARD_HEADER_SIZE]):
        return None
    return fields[2:]


def parse_shard_header(raw: memoryview | bytes) -> ShardHeader | None:
    """What a valid shard header says; None for any other bytes."""
    fields = _header_fields(raw)
    return None if fields is None else ShardHeader._make(fields)


def check_shard_header(raw: memoryview | bytes, bid: int, vuid: int, size: int, tag: int, where: str) -> None:
    """Raise ShardCorrupted unless `raw` is a valid header naming exactly this shard of the chunk tagged `tag`."""
    fields = _header_fields(raw)
    if fields is None:
        raise ShardCorrupted(f"bid {bid}: shard header damaged at {where}")
    if fields != (bid, vuid, size, tag):
        raise ShardCorrupted(f"bid {bid}: header at {where} is {ShardHeader._make(fields)}, expected vuid {vuid} "
                             f"size {size} (the index) and tag {tag} (the chunk's)")


def pack_footer(shard_crc: int) -> bytes:
    return _FOOTER.pack(FOOTER_MAGIC, shard_crc)


def footer_crc(raw: memoryview | bytes) -> int | None:
    """The shard CRC a valid footer holds; None for any other bytes."""
    if len(raw) < SHARD_FOOTER_SIZE:
        return None
    magic, crc = _FOOTER.unpack_from(raw)
    return int(crc) if magic == FOOTER_MAGIC else None


def check_footer(raw: memoryview | bytes, bid: int, shard_crc: int, where: str) -> None:
    magic, crc = _FOOTER.unpack_from(raw)
    if magic != FOOTER_MAGIC or crc != shard_crc:
        raise ShardCorrupted(f"bid {bid}: shard footer damaged at {where}")


def encode_shard(bid: int, vuid: int, data: memoryview, tag: int) -> tuple[list[memoryview | bytes], int, int]:
    """Buffers to pwritev for one shard (data is referenced, not copied) of the chunk whose tag is `tag`, its CRC,
    its physical size.

    The shard CRC is one pass over the whole data; block CRCs are a second pass over slices.
    At isal speeds (~28 GB/s) two passes cost less than combining CRCs in Python.
    """
    size = len(data)
    if size > MAX_SHARD_SIZE:
        raise ValueError(f"shard of {size} bytes exceeds the u32 size field")
    shard_crc = crc32(data)
    nblocks = block_count(size)
    crcs = bytearray(BLOCK_CRC_SIZE * nblocks)
    crc_view = memoryview(crcs)
    bufs: list[memoryview | bytes] = [pack_shard_header(bid, vuid, size, tag)]
    for i in range(nblocks):
        start = i * BLOCK_SIZE
        block = data[start:start + BLOCK_SIZE]
        _CRC.pack_into(crcs, i * BLOCK_CRC_SIZE, crc32(block))
        bufs.append(crc_view[i * BLOCK_CRC_SIZE:(i + 1) * BLOCK_CRC_SIZE])
        bufs.append(block)
    bufs.append(pack_footer(shard_crc))
    phys = physical_size(size)
    pad = phys - encoded_size(size)
    if pad:
        bufs.append(ZERO_PAGE[:pad])
    return bufs, shard_crc, phys


def unpack_crcs(raw: bytes | bytearray) -> tuple[int, ...]:
    """The block CRCs stored back to back in `raw`."""
    return struct.unpack(f"<{len(raw) // BLOCK_CRC_SIZE}I", raw)
