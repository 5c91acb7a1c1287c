"""Chunk file bytes made behind a ChunkFile's back: the layout before the chunk's tag (format version 1), written by
hand so that it does not change with the code, and the shard records a user can lay out inside a blob."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

from isal.isal_zlib import crc32

from blobstore_server.libs.chunkfile import format as fmt

_V1_CHUNK_HEADER = struct.Struct("<4sB16sq")  # magic, version, parent chunk id, ctime (ns); its CRC follows
_V1_SHARD_HEADER = struct.Struct("<IIQQI4x")  # header crc, magic, bid, vuid, size, zero padding


def version_1_header(ctime: int) -> bytes:
    """A chunk header (no parent) as version 1 wrote it, 4 KiB."""
    body = _V1_CHUNK_HEADER.pack(b"BSCK", 1, bytes(16), ctime)
    raw = body + struct.pack("<I", crc32(body))
    return raw + bytes(4096 - len(raw))


def make_version_1(path: Path) -> None:
    """Turn a chunk file that holds no shard yet into one made by version 1."""
    with open(path, "r+b") as f:
        f.write(version_1_header(time.time_ns()))


def version_1_shard_header(bid: int, vuid: int, size: int) -> bytes:
    """A shard header as version 1 wrote it."""
    body = _V1_SHARD_HEADER.pack(0, 0x5348_4244, bid, vuid, size)
    return struct.pack("<I", crc32(body[4:])) + body[4:]


def record(bid: int, vuid: int, data: bytes, tag: int) -> bytes:
    """A complete shard record (header, block CRCs, footer, padding) carrying `tag`."""
    bufs, _, _ = fmt.encode_shard(bid, vuid, memoryview(data), tag)
    return b"".join(bytes(b) for b in bufs)


def torn_put_holding(inner: bytes, bid: int, vuid: int, tag: int) -> bytes:
    """What a put into a chunk tagged `tag` leaves when a power cut tears it, its payload (user bytes) holding the
    record `inner` at a 4 KiB boundary of the file: appended where the put started, its header, and its payload up to
    a while past `inner`; no footer, so never acknowledged."""
    to_boundary = fmt.ALIGN - fmt.SHARD_HEADER_SIZE - fmt.BLOCK_CRC_SIZE  # the put's data starts after these
    filler = random.Random(bid).randbytes
    data = filler(to_boundary) + inner + filler(20_000)
    assert len(data) <= fmt.BLOCK_SIZE  # one block: no block CRC lands inside `inner`
    return record(bid, vuid, data, tag)[:fmt.ALIGN + len(inner) + 1_000]
