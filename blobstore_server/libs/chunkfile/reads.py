"""Reading a chunk's shards: one preadv per range (through the page cache, from it only, or past it with O_DIRECT),
then every 64 KiB block the range touches checked against its CRC. No lock is taken during I/O."""

from __future__ import annotations

import errno
import os
from enum import Enum

from isal.isal_zlib import crc32

from blobstore_server.libs.buffers import uninitialized
from blobstore_server.libs.proto.ids import ChunkId

from . import format as fmt
from .errors import RangeError, ShardCorrupted, ShardMarkDeleted, ShardNotFound
from .fileio import IOV_MAX, Descriptors, pread_direct
from .index import ShardIndex, ShardMeta, ShardStatus

EMPTY = memoryview(b"")


class NotCached(Exception):
    """A read without waiting found part of its range outside the page cache."""


class Read(Enum):
    """How a read reaches the bytes."""

    CACHED = "page cache only"  # never waits for the disk: `NotCached` instead
    WAIT = "through the page cache"
    DIRECT = "past the page cache"  # O_DIRECT where the file system allows it, else as WAIT


def bounds(meta: ShardMeta, offset: int, size: int | None) -> tuple[int, int]:
    if size is None:
        size = meta.size - offset
    if offset < 0 or size < 0 or offset + size > meta.size:
        raise RangeError(f"bid {meta.bid}: range {offset}+{size} outside shard of {meta.size} bytes")
    return offset, offset + size


class ShardReader:
    """Verified reads of one chunk's shards, found through its slice of the index."""

    def __init__(self, fds: Descriptors, index: ShardIndex, chunk_id: ChunkId, tag: int) -> None:
        self.fds = fds
        self.index = index
        self.chunk_id = chunk_id
        self.tag = tag  # every shard header of the chunk carries it

    def stat(self, bid: int) -> ShardMeta:
        meta = self.index.get(bid)
        if meta is None:
            raise ShardNotFound(f"bid {bid} not in chunk {self.chunk_id}")
        return meta

    def readable(self, bid: int) -> ShardMeta:
        meta = self.stat(bid)
        if meta.status == ShardStatus.MARK_DELETED:
            raise ShardMarkDeleted(f"bid {bid} in chunk {self.chunk_id} is mark-deleted")
        return meta

    def read_checked(self, meta: ShardMeta, lo: int, hi: int, how: Read = Read.WAIT) -> memoryview:
        """A CRC failure on a shard deleted meanwhile (hole punched) is 'not found', not corruption."""
        try:
            return self.read_range(meta, lo, hi, how)
        except ShardCorrupted:
            now = self.index.get(meta.bid)
            if now is None or now.offset != meta.offset:
                raise ShardNotFound(f"bid {meta.bid} was deleted from chunk {self.chunk_id}") from None
            raise

    def read_range(self, meta: ShardMeta, lo: int, hi: int, how: Read = Read.WAIT) -> memoryview:
        """One preadv covering the touched blocks (plus header/footer when adjacent), then CRC checks; `how`:
        `Read`. The preadv scatters block data into one buffer and the CRCs beside it, so the verified range is
        handed out as a read-only view: nothing is joined."""
        size = meta.size
        if lo == hi and size:
            return EMPTY
        where = f"chunk {self.chunk_id} offset {meta.offset}"
        first, last = lo // fmt.BLOCK_SIZE, (hi - 1) // fmt.BLOCK_SIZE  # last < first: a shard of size 0
        is_tail = last == fmt.block_count(size) - 1
        blocks = last - first + 1
        data = uninitialized(0 if size == 0 else (blocks - 1) * fmt.BLOCK_SIZE + fmt.block_len(size, last))
        crcs = bytearray(fmt.BLOCK_CRC_SIZE * blocks)
        header, footer = bytearray(fmt.SHARD_HEADER_SIZE), bytearray(fmt.SHARD_FOOTER_SIZE)
        views = [memoryview(header)] if first == 0 else []
        crc_view = memoryview(crcs)
        for k in range(blocks):
            views.append(crc_view[k * fmt.BLOCK_CRC_SIZE:(k + 1) * fmt.BLOCK_CRC_SIZE])
            views.append(data[k * fmt.BLOCK_SIZE:(k + 1) * fmt.BLOCK_SIZE])
        if is_tail:
            views.append(memoryview(footer))
        want = sum(v.nbytes for v in views)
        if self._preadv(views, meta.offset + (0 if first == 0 else fmt.block_pos(first)), how) != want:
            raise ShardCorrupted(f"bid {meta.bid}: shard truncated at {where}")
        if first == 0:
            fmt.check_shard_header(header, meta.bid, meta.vuid, size, self.tag, where)
        for k, stored in enumerate(fmt.unpack_crcs(crcs)):
            block = data[k * fmt.BLOCK_SIZE:(k + 1) * fmt.BLOCK_SIZE]
            if crc32(block) != stored:
                base = (first + k) * fmt.BLOCK_SIZE
                raise ShardCorrupted(
                    f"bid {meta.bid}: block {first + k} (shard bytes {base}..{base + block.nbytes}) failed its CRC "
                    f"at file offset {meta.offset + fmt.block_pos(first + k)} of chunk {self.chunk_id}")
        if is_tail:
            fmt.check_footer(footer, meta.bid, meta.crc, where)
        base = first * fmt.BLOCK_SIZE
        return data[lo - base:hi - base].toreadonly() if size else EMPTY

    def _preadv(self, views: list[memoryview], offset: int, how: Read) -> int:
        """Bytes read into `views` (fewer only at the end of the file), in IOV_MAX batches; `Read.CACHED`:
        `NotCached` unless every byte is in the page cache."""
        direct_fd = self.fds.direct() if how is Read.DIRECT else None
        if direct_fd is not None:
            return pread_direct(direct_fd, views, offset)
        wait = how is not Read.CACHED
        got = 0
        for i in range(0, len(views), IOV_MAX):
            batch = views[i:i + IOV_MAX]
            try:
                n = os.preadv(self.fds.fd, batch, offset + got, 0 if wait else os.RWF_NOWAIT)
            except BlockingIOError:
                raise NotCached from None
            except OSError as exc:
                if not wait and exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no RWF_NOWAIT here: always wait
                    raise NotCached from None
                raise
            got += n
            if n < sum(v.nbytes for v in batch):
                if not wait:  # partly cached, or truncated: the waiting read tells which
                    raise NotCached
                break
        return got
