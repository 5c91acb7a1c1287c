"""One chunk file: append shards, read verified ranges, mark/delete, compact.

Durability rule: shard bytes are made durable (fdatasync) before the index entry is written, so an
index entry always points at complete bytes; concurrent writers to all chunks of a disk share one
fdatasync per chunk and one index batch (`libs.chunkfile.commit`). That batch is not synced: a shard is
durable once its bytes are, because it describes itself (header, block CRCs, footer). The chunk's watermark
(`index.py`), written with each batch, says where shards whose entries a power cut may have lost can start; on
open, the complete shards past it that carry the chunk's tag (`format.py`: a record inside a put torn by the cut,
user bytes, does not) are indexed again and the torn tail after the last one is cut off. A delete first moves the
watermark past its shard, in the same synced batch, so that no deleted shard is found again.

The batches of groups and deletes land in the index's log in either order, and a power cut keeps a prefix of it.
So a watermark is computed only from puts indexed by a batch already written (a committing group's puts pend until
their batch is written: a delete's synced batch, written ahead of it, stays below them, else the cut that loses the
group's entries would leave them under the delete's watermark, never found again), and the index's watermark never
goes down (computed and written under one lock, `GroupCommit.write_marked`, never below the last one written: a
lower one would have open find again a deleted shard whose hole punch the cut lost).

Concurrency: the write offset is reserved under a short lock and the bytes are written
with pwritev outside it, so concurrent puts overlap. Reads take no lock during I/O.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Self

from isal.isal_zlib import crc32

from blobstore_server.libs.buffers import uninitialized
from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.ids import ChunkId

from . import format as fmt
from .commit import GroupCommit, StagedPut
from .errors import (
    ChunkError,
    ChunkFull,
    ChunkReadOnly,
    CrcMismatch,
    RangeError,
    ShardCorrupted,
    ShardExists,
    ShardMarkDeleted,
    ShardNotFound,
)
from .index import ShardIndex, ShardMeta, ShardStatus, check_bid
from .punch import punch_hole

_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
_EMPTY = memoryview(b"")
SyncObserver = Callable[[float], object]  # told the seconds each fdatasync of shard bytes took


class _NotCached(Exception):
    """A read without waiting found part of its range outside the page cache."""


@dataclass(frozen=True)
class ChunkStats:
    shard_count: int
    live_bytes: int  # sum of the data sizes of indexed shards (incl. mark-deleted)
    physical_bytes: int  # sum of their 4 KiB-aligned extents
    write_offset: int  # where the next shard goes
    punched_bytes: int  # bytes below write_offset owned by no indexed shard (punched or abandoned)
    disk_bytes: int  # st_blocks * 512: what the file really occupies


def _pwritev_all(fd: int, bufs: list[memoryview | bytes], offset: int) -> None:
    """pwritev that survives short writes and lists longer than IOV_MAX."""
    views = [memoryview(b) for b in bufs]
    i = 0
    while i < len(views):
        n = os.pwritev(fd, views[i:i + _IOV_MAX], offset)
        if n == 0 and any(v.nbytes for v in views[i:i + _IOV_MAX]):
            raise OSError(f"pwritev wrote nothing at offset {offset}")
        offset += n
        while i < len(views) and n >= views[i].nbytes:
            n -= views[i].nbytes
            i += 1
        if n:
            views[i] = views[i][n:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# O_DIRECT wants the offset, the length and the buffer aligned to the device's logical block: a page covers any.
DIRECT_ALIGN = mmap.PAGESIZE


def _align_up(n: int, align: int) -> int:
    return -(-n // align) * align


class _Staging(threading.local):
    """Each thread's page-aligned buffer for direct I/O, kept: a fresh one would page-fault on every use."""

    def __init__(self) -> None:
        self.buffer = mmap.mmap(-1, DIRECT_ALIGN)

    def region(self, length: int) -> memoryview:
        """The first `length` bytes of the buffer, grown first if needed; valid until this thread's next call."""
        if len(self.buffer) < length:
            self.buffer.close()
            self.buffer = mmap.mmap(-1, _align_up(length, 1 << 20))
        return memoryview(self.buffer)[:length]

    def image(self, bufs: list[memoryview | bytes], length: int) -> memoryview:
        """`bufs` one after the other, zero-padded to `length` (a multiple of DIRECT_ALIGN)."""
        image = self.region(length)
        pos = 0
        for buf in bufs:
            image[pos:pos + len(buf)] = buf
            pos += len(buf)
        image[pos:] = bytes(length - pos)
        return image


_staging = _Staging()


class _Read(Enum):
    """How a read reaches the bytes."""

    CACHED = "page cache only"  # never waits for the disk: `_NotCached` instead
    WAIT = "through the page cache"
    DIRECT = "past the page cache"  # O_DIRECT where the file system allows it, else as WAIT


def _pread_direct(fd: int, views: list[memoryview], offset: int) -> int:
    """`os.preadv(fd, views, offset)` for an O_DIRECT `fd`: the enclosing aligned range into this thread's staging
    buffer, then copied out to `views`."""
    start = offset // DIRECT_ALIGN * DIRECT_ALIGN
    want = sum(view.nbytes for view in views)
    region = _staging.region(_align_up(offset + want, DIRECT_ALIGN) - start)
    got = 0
    while got < len(region):
        n = os.preadv(fd, [region[got:]], start + got)
        if n == 0:  # the end of the file
            break
        got += n
    pos, end = offset - start, min(got, offset - start + want)
    for view in views:
        take = max(0, min(view.nbytes, end - pos))
        view[:take] = region[pos:pos + take]
        pos += take
    return max(0, end - (offset - start))


class ChunkFile:
    """A chunk file plus its slice of the disk's shard index. Thread-safe."""

    def __init__(self, path: Path, kv: KVStore, chunk_id: ChunkId, fd: int, header: fmt.ChunkHeader,
                 *, sync: bool, max_size: int | None, on_sync: SyncObserver | None = None,
                 commits: GroupCommit | None = None) -> None:
        """Use `create` or `open`. Chunks of one disk share its `commits` (else the chunk has its own)."""
        self.path = Path(path)
        self.on_sync = on_sync
        self.kv = kv
        self.chunk_id = chunk_id
        self.parent: ChunkId | None = header.parent
        self.ctime = header.ctime
        self.tag = header.tag  # every shard header of the chunk carries it
        self.sync = sync
        self.max_size = max_size
        self._fd = fd
        self._direct_fd: int | None = None  # opened on the first direct write or read
        self._direct_refused = False  # the file system refused O_DIRECT: direct I/O goes through the page cache
        self.commits = commits or GroupCommit(kv)
        self._index = ShardIndex(kv, chunk_id)
        self._cond = threading.Condition()  # guards everything below
        self._write_off = fmt.CHUNK_HEADER_SIZE
        self._pending: dict[int, int] = {}  # bids being written -> their offsets; a put of one waits on _cond
        self._watermark = fmt.CHUNK_HEADER_SIZE  # the index's (the last one written); under commits' marking lock
        self._inflight = 0  # physical bytes reserved by unfinished puts
        self._count = 0
        self._live = 0
        self._live_phys = 0
        self._users = 0
        self._closed = False
        self._readonly: str | None = None  # why writes are refused
        self._broken: BaseException | None = None  # a failed sync: nothing is durable anymore
        self._meta_lock = threading.RLock()  # serialises index read-modify-writes

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, path: Path, kv: KVStore, chunk_id: ChunkId, *, parent: ChunkId | None = None,
               sync: bool = True, max_size: int | None = None, on_sync: SyncObserver | None = None,
               commits: GroupCommit | None = None) -> Self:
        """Make a new, empty chunk file; fails if the file exists or the index has entries for it."""
        path = Path(path)
        if next(ShardIndex(kv, chunk_id).scan(), None) is not None:
            raise ChunkError(f"index already holds shards of chunk {chunk_id}")
        header = fmt.ChunkHeader(parent=parent, ctime=time.time_ns(), tag=fmt.new_tag())
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.pwrite(fd, header.pack(), 0)
            if sync:
                os.fsync(fd)
                _fsync_dir(path.parent)
            batch = kv.batch()
            ShardIndex(kv, chunk_id).watermark_into(batch, fmt.CHUNK_HEADER_SIZE)
            kv.write(batch)
        except BaseException:
            os.close(fd)
            with suppress(OSError):
                path.unlink()
            raise
        return cls(path, kv, chunk_id, fd, header, sync=sync, max_size=max_size, on_sync=on_sync, commits=commits)

    @classmethod
    def open(cls, path: Path, kv: KVStore, chunk_id: ChunkId, *, sync: bool = True,
             max_size: int | None = None, on_sync: SyncObserver | None = None,
             commits: GroupCommit | None = None) -> Self:
        """Open an existing chunk, verify its header and cut off any unacknowledged tail."""
        path = Path(path)
        fd = os.open(path, os.O_RDWR)
        try:
            header = fmt.ChunkHeader.unpack(os.pread(fd, fmt.CHUNK_HEADER_SIZE, 0))
            chunk = cls(path, kv, chunk_id, fd, header, sync=sync, max_size=max_size, on_sync=on_sync,
                        commits=commits)
            chunk._recover()
        except BaseException:
            os.close(fd)
            raise
        return chunk

    @classmethod
    def open_readonly(cls, path: Path, kv: KVStore, chunk_id: ChunkId) -> ChunkFile:
        """Open a chunk another process writes, to read shards only (`kv` is a secondary view of its index):
        nothing is recovered or cut off here, the writer owns the file."""
        fd = os.open(path, os.O_RDONLY)
        try:
            header = fmt.ChunkHeader.unpack(os.pread(fd, fmt.CHUNK_HEADER_SIZE, 0))
            return cls(path, kv, chunk_id, fd, header, sync=False, max_size=None)
        except BaseException:
            os.close(fd)
            raise

    def _recover(self) -> None:
        """Rebuild counters from the index; drop entries past EOF; index again the complete shards past the
        watermark (their entries were lost with the index's unsynced tail); truncate the torn tail."""
        file_size = os.fstat(self._fd).st_size
        end = fmt.CHUNK_HEADER_SIZE
        batch = self.kv.batch()
        for meta in self._index.scan():
            phys = fmt.physical_size(meta.size)
            if meta.offset + phys > file_size or meta.offset < fmt.CHUNK_HEADER_SIZE:
                self._index.delete_into(batch, meta.bid)  # only possible if data was not synced (sync=False)
                continue
            self._count_in(meta)
            end = max(end, meta.offset + phys)
        watermark = self._index.watermark()
        if watermark is not None:
            for meta in self._found_past(watermark, file_size).values():
                if self._index.get(meta.bid) is None:
                    self._index.put_into(batch, meta)
                    self._count_in(meta)
                    end = max(end, meta.offset + fmt.physical_size(meta.size))
        if file_size > end:  # cut first: a watermark at `end` must never have bytes of a deleted shard past it
            os.ftruncate(self._fd, end)
            if self.sync:
                os.fsync(self._fd)
        if batch.count or watermark != end:  # one synced batch: from here on the watermark holds
            self._index.watermark_into(batch, end)
            self.kv.write(batch)
        self._write_off = self._watermark = end

    def _count_in(self, meta: ShardMeta) -> None:
        self._count += 1
        self._live += meta.size
        self._live_phys += fmt.physical_size(meta.size)

    def _found_past(self, start: int, file_size: int) -> dict[int, ShardMeta]:
        """The complete shards of this chunk starting at or past `start`, by bid (a bid found twice: the later one,
        a retried put; a record inside user bytes never counts, see `_shard_at`). Shards start 4 KiB aligned; a
        page that starts none (a put that failed, a torn one) is stepped over."""
        found: dict[int, ShardMeta] = {}
        pos = fmt.align_up(max(start, fmt.CHUNK_HEADER_SIZE))
        while pos + fmt.SHARD_HEADER_SIZE + fmt.SHARD_FOOTER_SIZE <= file_size:
            meta = self._shard_at(pos, file_size)
            if meta is None:
                pos += fmt.ALIGN
                continue
            found[meta.bid] = meta
            pos += fmt.physical_size(meta.size)
        return found

    def _shard_at(self, pos: int, file_size: int) -> ShardMeta | None:
        """The shard starting at `pos` if every part of it checks (header carrying this chunk's tag and naming its
        unit, each block's CRC, footer); else None. A torn put's payload may hold a complete record (user bytes):
        its tag is not the chunk's, which no user sees. A version-1 chunk has no tag (0, like any record a user
        makes): there only the unit tells, and a record of this unit in a torn put is not told from a shard."""
        named = fmt.parse_shard_header(os.pread(self._fd, fmt.SHARD_HEADER_SIZE, pos))
        if named is None or pos + fmt.encoded_size(named.size) > file_size:
            return None
        bid, vuid, size, tag = named
        if tag != self.tag or vuid >> 24 != self.chunk_id.vuid >> 24:  # before reading it (`_read_range` checks tags)
            return None
        crc = fmt.footer_crc(os.pread(self._fd, fmt.SHARD_FOOTER_SIZE, pos + fmt.footer_pos(size)))
        if crc is None:
            return None
        meta = ShardMeta(bid=bid, vuid=vuid, offset=pos, size=size, crc=crc, status=ShardStatus.NORMAL,
                         written_at=int(time.time()))
        try:
            data = self._read_range(meta, 0, size)
        except ShardCorrupted:
            return None
        return meta if crc32(data) == crc else None

    def close(self) -> None:
        """Wait for running operations, then close the file descriptor (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.wait_for(lambda: self._users == 0)
        os.close(self._fd)
        if self._direct_fd is not None:
            os.close(self._direct_fd)

    def __enter__(self) -> ChunkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChunkFile({self.chunk_id}, {self.path})"

    @contextmanager
    def _use(self) -> Iterator[None]:
        """Keep the fd open while an operation runs (close waits), so it is never reused under us."""
        self._enter()
        try:
            yield
        finally:
            self._leave()

    def _enter(self) -> None:
        with self._cond:
            if self._closed:
                raise ChunkError(f"chunk {self.chunk_id} is closed")
            self._users += 1

    def _leave(self) -> None:
        with self._cond:
            self._users -= 1
            if self._closed and self._users == 0:
                self._cond.notify_all()

    # ------------------------------------------------------------ writes

    def put_shard(self, bid: int, vuid: int, data: bytes | bytearray | memoryview, *,
                  direct: bool = False) -> ShardMeta:
        """Store a shard durably and index it. Same bid + same bytes returns the existing meta."""
        return self.commits.stored(self.stage_put(bid, vuid, data, direct=direct))

    def stage_put(self, bid: int, vuid: int, data: bytes | bytearray | memoryview, *,
                  blocking: bool = True, expected_crc: int | None = None, direct: bool = False
                  ) -> ShardMeta | StagedPut | None:
        """Write a shard's bytes at a reserved offset; the caller then commits the `StagedPut` through
        `self.commits`, which makes it durable and indexes it. An already stored equal shard is returned as
        its meta. With `blocking` False, None instead of waiting for a concurrent put of the same bid or
        reading a stored one back to compare (so an event loop can call it and fall back to a thread).

        `direct` (for a thread; shards nobody is about to read: rebuilt, migrated) writes past the page cache
        (O_DIRECT) at a page-aligned offset, from this thread's staging buffer: no copy into fresh page-cache
        pages, no writeback later, no cached pages pushed out. The padding to the next page is left unused."""
        check_bid(bid)
        view = memoryview(data).cast("B")
        bufs, crc, phys = fmt.encode_shard(bid, vuid, view, self.tag)
        if expected_crc is not None and crc != expected_crc:
            raise CrcMismatch(f"bid {bid}: the bytes have CRC {crc}, the request said {expected_crc}")
        direct_fd = self._direct() if direct else None
        self._enter()
        staged: StagedPut | None = None
        try:
            with self._cond:
                if bid in self._pending:
                    if not blocking:
                        return None
                    self._cond.wait_for(lambda: bid not in self._pending)  # then compare with what it stored
                self._check_writable()
                existing = self._index.get(bid)
                if existing is None:
                    offset = self._reserve(phys, 1 if direct_fd is None else DIRECT_ALIGN)
                    self._pending[bid] = offset
            if existing is not None:
                return None if not blocking else self._same_or_exists(existing, vuid, view, crc)
            meta = ShardMeta(bid=bid, vuid=vuid, offset=offset, size=len(view), crc=crc,
                             status=ShardStatus.NORMAL, written_at=int(time.time()))
            written = StagedPut(self, meta, phys)
            try:
                self._write_at(offset, bufs, phys, direct_fd)
            except BaseException:
                self._settle(written, ok=False)
                raise
            staged = written
            return staged
        finally:
            if staged is None:
                self._leave()

    def _write_at(self, offset: int, bufs: list[memoryview | bytes], phys: int, direct_fd: int | None) -> None:
        """Write a shard's encoded bytes at its reserved offset; past the page cache through `direct_fd`."""
        if direct_fd is None:
            _pwritev_all(self._fd, bufs, offset)
        else:
            image = _staging.image(bufs, _align_up(phys, DIRECT_ALIGN))
            if os.pwrite(direct_fd, image, offset) != len(image):
                raise OSError(errno.EIO, f"short direct write at offset {offset} of chunk {self.chunk_id}")

    def _direct(self) -> int | None:
        """The chunk's O_DIRECT descriptor, opened once with the access mode of the chunk's own (a chunk opened
        read-only reads direct too); None where the file system refuses O_DIRECT."""
        with self._cond:
            if self._direct_fd is None and not self._direct_refused:
                try:
                    mode = fcntl.fcntl(self._fd, fcntl.F_GETFL) & os.O_ACCMODE
                    self._direct_fd = os.open(self.path, mode | os.O_DIRECT)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._direct_refused = True
            return self._direct_fd

    def sync_data(self) -> None:
        """fdatasync the chunk's bytes (a no-op without `sync`); after one failed, every later one fails too:
        a retried fdatasync may report success for pages the failed one dropped."""
        if self._broken is not None:
            raise ChunkError(f"chunk {self.chunk_id}: a sync failed earlier") from self._broken
        if self.sync:
            started = time.perf_counter()
            os.fdatasync(self._fd)
            if self.on_sync is not None:
                self.on_sync(time.perf_counter() - started)

    def index_into(self, batch: Batch, meta: ShardMeta) -> None:
        self._index.put_into(batch, meta)

    def watermark_into(self, batch: Batch, committing: Collection[int]) -> None:
        """The watermark, into the batch that indexes `committing` (bids; `GroupCommit.write_marked` holds its lock
        until the batch is written): where the first put not indexed by a written batch nor by this one starts, or
        the next put would, but never below the index's. A committing group's puts pend until their batch is
        written, so a delete's batch written ahead of it never covers them. The index's once `batch` is written."""
        with self._cond:
            low = min((offset for bid, offset in self._pending.items() if bid not in committing),
                      default=self._write_off)
        mark = max(self._watermark, low)
        self._index.watermark_into(batch, mark)

        def written() -> None:
            self._watermark = mark

        batch.on_written(written)

    def finish_put(self, staged: StagedPut, error: BaseException | None) -> None:
        """End a staged put: counted when its commit succeeded, else the chunk takes no more writes."""
        if error is not None:
            with self._cond:
                self._broken = self._broken or error
        self._settle(staged, ok=error is None)
        self._leave()

    def _check_writable(self) -> None:
        if self._broken is not None:
            raise ChunkReadOnly(f"chunk {self.chunk_id} is broken: {self._broken}")
        if self._readonly is not None:
            raise ChunkReadOnly(f"chunk {self.chunk_id} is read-only: {self._readonly}")

    def _reserve(self, phys: int, align: int = 1) -> int:
        """Claim [offset, offset+phys), offset and end rounded up to `align`; caller holds _cond."""
        offset = _align_up(self._write_off, align)
        end = offset + _align_up(phys, align)
        if self.max_size is not None and end > self.max_size:
            raise ChunkFull(f"chunk {self.chunk_id}: {phys} more bytes at {offset} exceed {self.max_size}")
        self._write_off = end
        self._inflight += phys
        return offset

    def _settle(self, staged: StagedPut, ok: bool) -> None:
        meta, phys = staged.meta, staged.phys
        with self._cond:
            self._inflight -= phys
            if ok:
                self._count += 1
                self._live += meta.size
                self._live_phys += phys
            elif self._write_off == meta.offset + phys:
                self._write_off = meta.offset  # the failed shard was last: reuse its space
            self._pending.pop(meta.bid, None)
            self._cond.notify_all()

    def _same_or_exists(self, existing: ShardMeta, vuid: int, view: memoryview, crc: int) -> ShardMeta:
        """Idempotent retry check: equal only if vuid, size, crc and every byte match."""
        same_sum = (existing.vuid, existing.size, existing.crc) == (vuid, len(view), crc)
        if same_sum and self._read_range(existing, 0, existing.size) == view:
            return existing
        raise ShardExists(f"bid {existing.bid} already stored in chunk {self.chunk_id} with other bytes")

    # ------------------------------------------------------------ reads

    def stat_shard(self, bid: int) -> ShardMeta:
        meta = self._index.get(bid)
        if meta is None:
            raise ShardNotFound(f"bid {bid} not in chunk {self.chunk_id}")
        return meta

    def _readable(self, bid: int) -> ShardMeta:
        meta = self.stat_shard(bid)
        if meta.status == ShardStatus.MARK_DELETED:
            raise ShardMarkDeleted(f"bid {bid} in chunk {self.chunk_id} is mark-deleted")
        return meta

    @staticmethod
    def _bounds(meta: ShardMeta, offset: int, size: int | None) -> tuple[int, int]:
        if size is None:
            size = meta.size - offset
        if offset < 0 or size < 0 or offset + size > meta.size:
            raise RangeError(f"bid {meta.bid}: range {offset}+{size} outside shard of {meta.size} bytes")
        return offset, offset + size

    def read_shard(self, bid: int, offset: int = 0, size: int | None = None) -> memoryview:
        """Bytes [offset, offset+size) of a shard, read-only; verifies only the 64 KiB blocks they touch."""
        with self._use():
            meta = self._readable(bid)
            lo, hi = self._bounds(meta, offset, size)
            return self._read_checked(meta, lo, hi)

    def read_cached(self, bid: int, offset: int, size: int | None, limit: int
                    ) -> tuple[ShardMeta, memoryview | None]:
        """`read_shard` for an event loop, which must not wait on the disk: the bytes when the range is at most
        `limit` long and all of it is in the page cache (an `RWF_NOWAIT` read), else None, with the meta either
        way. Lookup and range errors raise as in `read_shard`."""
        with self._use():
            meta = self._readable(bid)
            lo, hi = self._bounds(meta, offset, size)
            if hi - lo > limit:
                return meta, None
            try:
                return meta, self._read_checked(meta, lo, hi, _Read.CACHED)
            except _NotCached:
                return meta, None

    def iter_shard(self, bid: int, offset: int = 0, size: int | None = None,
                   piece: int = 1 << 20, direct: bool = False) -> Iterator[memoryview]:
        """Like read_shard in block-aligned pieces. Lookup and range errors raise at call time. `direct` (for
        background reads: repair, migration, scrubbing) reads past the page cache (O_DIRECT, through this
        thread's staging buffer): bytes read once are not worth fresh cache pages (~1.4 ms of CPU per MB here,
        against 0.04 direct), nor pushing out the pages users read."""
        with self._use():
            meta = self._readable(bid)
            lo, hi = self._bounds(meta, offset, size)
        step = max(fmt.BLOCK_SIZE, piece // fmt.BLOCK_SIZE * fmt.BLOCK_SIZE)
        return self._pieces(meta, lo, hi, step, _Read.DIRECT if direct else _Read.WAIT)

    def _pieces(self, meta: ShardMeta, lo: int, hi: int, step: int, how: _Read) -> Iterator[memoryview]:
        if lo == hi and meta.size:
            return
        while True:
            end = min(hi, (lo // step + 1) * step)
            with self._use():
                yield self._read_checked(meta, lo, end, how)
            lo = end
            if lo >= hi:
                return

    def verify_shard(self, bid: int) -> ShardMeta:
        """Check header, every block and the footer (mark-deleted shards too); for scrubbing."""
        with self._use():
            meta = self.stat_shard(bid)
            data = self._read_checked(meta, 0, meta.size)
            if crc32(data) != meta.crc:
                raise ShardCorrupted(f"bid {bid}: shard crc mismatch against the index")
            return meta

    def _read_checked(self, meta: ShardMeta, lo: int, hi: int, how: _Read = _Read.WAIT) -> memoryview:
        """A CRC failure on a shard deleted meanwhile (hole punched) is 'not found', not corruption."""
        try:
            return self._read_range(meta, lo, hi, how)
        except ShardCorrupted:
            now = self._index.get(meta.bid)
            if now is None or now.offset != meta.offset:
                raise ShardNotFound(f"bid {meta.bid} was deleted from chunk {self.chunk_id}") from None
            raise

    def _read_range(self, meta: ShardMeta, lo: int, hi: int, how: _Read = _Read.WAIT) -> memoryview:
        """One preadv covering the touched blocks (plus header/footer when adjacent), then CRC checks; `how`:
        `_Read`. The preadv scatters block data into one buffer and the CRCs beside it, so the verified range is
        handed out as a read-only view: nothing is joined."""
        size = meta.size
        if lo == hi and size:
            return _EMPTY
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
        return data[lo - base:hi - base].toreadonly() if size else _EMPTY

    def _preadv(self, views: list[memoryview], offset: int, how: _Read) -> int:
        """Bytes read into `views` (fewer only at the end of the file), in IOV_MAX batches; `_Read.CACHED`:
        `_NotCached` unless every byte is in the page cache."""
        direct_fd = self._direct() if how is _Read.DIRECT else None
        if direct_fd is not None:
            return _pread_direct(direct_fd, views, offset)
        wait = how is not _Read.CACHED
        got = 0
        for i in range(0, len(views), _IOV_MAX):
            batch = views[i:i + _IOV_MAX]
            try:
                n = os.preadv(self._fd, batch, offset + got, 0 if wait else os.RWF_NOWAIT)
            except BlockingIOError:
                raise _NotCached from None
            except OSError as exc:
                if not wait and exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no RWF_NOWAIT here: always wait
                    raise _NotCached from None
                raise
            got += n
            if n < sum(v.nbytes for v in batch):
                if not wait:  # partly cached, or truncated: the waiting read tells which
                    raise _NotCached
                break
        return got

    def list_shards(self, start_bid: int = 0, count: int | None = None,
                    status: ShardStatus | None = None) -> list[ShardMeta]:
        """Index entries with bid >= start_bid in bid order, optionally of one status."""
        out: list[ShardMeta] = []
        if count is not None and count <= 0:
            return out
        for meta in self._index.scan(start_bid):
            if status is None or meta.status == status:
                out.append(meta)
                if count is not None and len(out) >= count:
                    break
        return out

    # ------------------------------------------------------------ deletes

    def _set_status(self, bid: int, status: ShardStatus) -> ShardMeta:
        with self._use(), self._meta_lock:
            meta = self.stat_shard(bid)
            if meta.status != status:
                marked = int(time.time()) if status is ShardStatus.MARK_DELETED else 0
                meta = replace(meta, status=status, marked_at=marked)
                self._index.put(meta)
            return meta

    def mark_delete(self, bid: int) -> ShardMeta:
        """Reversible first step of a delete: reads now fail with ShardMarkDeleted."""
        return self._set_status(bid, ShardStatus.MARK_DELETED)

    def unmark_delete(self, bid: int) -> ShardMeta:
        return self._set_status(bid, ShardStatus.NORMAL)

    def delete_shard(self, bid: int) -> None:
        """Drop the index entry, then punch the extent. A crash between leaks space, never data. The watermark
        moves past the shard in the same synced batch (once every put below its end has settled: a put reserved
        after that starts past the shard), so that `open` never finds it again."""
        with self._use(), self._meta_lock:
            meta = self.stat_shard(bid)
            phys = fmt.physical_size(meta.size)
            with self._cond:
                self._cond.wait_for(lambda: all(offset >= meta.offset + phys for offset in self._pending.values()))
            batch = self.kv.batch()
            self._index.delete_into(batch, bid)
            self.commits.write_marked(batch, [(self, ())], sync=True)
            with self._cond:
                self._count -= 1
                self._live -= meta.size
                self._live_phys -= phys
            punch_hole(self._fd, meta.offset, phys)

    def remove_index(self) -> None:
        """Drop every index entry of this chunk in one batch (after release or compaction)."""
        with self._use(), self._meta_lock:
            batch = self.kv.batch()
            for meta in self._index.scan():
                self._index.delete_into(batch, meta.bid)
            self._index.watermark_into(batch, None)
            self.kv.write(batch)
            with self._cond:
                self._count = self._live = self._live_phys = 0

    def stats(self) -> ChunkStats:
        with self._use():
            blocks = os.fstat(self._fd).st_blocks
            with self._cond:
                used = self._write_off - fmt.CHUNK_HEADER_SIZE
                return ChunkStats(
                    shard_count=self._count, live_bytes=self._live, physical_bytes=self._live_phys,
                    write_offset=self._write_off,
                    punched_bytes=used - self._live_phys - self._inflight,
                    disk_bytes=blocks * 512)

    # ------------------------------------------------------------ compaction

    def compact_into(self, path: Path, new_id: ChunkId, *,
                     before_commit: Callable[[Batch], None] | None = None) -> ChunkFile:
        """Copy every indexed shard (mark-deleted too) into a new chunk whose parent is this one (a version-2 chunk
        with a tag of its own, which the copies carry).

        Writes to this chunk are refused from the start; each shard is re-verified while read.
        The new data is synced, then one KV batch moves all index entries (plus whatever
        `before_commit` adds, e.g. the blobnode's chunk record). Afterwards this chunk stays
        read-only and indexless; the caller closes and removes it.
        """
        with self._use(), self._meta_lock:
            with self._cond:
                self._check_writable()
                self._readonly = f"compacting into {new_id}"
                self._cond.wait_for(lambda: not self._pending)
            new: ChunkFile | None = None
            try:
                new = ChunkFile.create(path, self.kv, new_id, parent=self.chunk_id, sync=self.sync,
                                       max_size=self.max_size, on_sync=self.on_sync, commits=self.commits)
                moved: list[ShardMeta] = []
                for meta in self._index.scan():
                    data = self._read_range(meta, 0, meta.size, _Read.DIRECT)
                    bufs, crc, phys = fmt.encode_shard(meta.bid, meta.vuid, data, new.tag)
                    if crc != meta.crc:
                        raise ShardCorrupted(f"bid {meta.bid}: shard crc mismatch against the index")
                    with new._cond:
                        offset = new._reserve(phys)
                        new._inflight -= phys
                    _pwritev_all(new._fd, bufs, offset)
                    moved.append(replace(meta, offset=offset))
                new.sync_data()
                batch = self.kv.batch()
                for meta in moved:
                    new._index.put_into(batch, meta)
                    self._index.delete_into(batch, meta.bid)
                self._index.watermark_into(batch, None)
                if before_commit is not None:
                    before_commit(batch)
                self.kv.write(batch)
            except BaseException:
                with self._cond:
                    self._readonly = None
                if new is not None:
                    new.close()
                    with suppress(OSError):
                        Path(path).unlink()
                raise
            with new._cond:
                for meta in moved:
                    new._count += 1
                    new._live += meta.size
                    new._live_phys += fmt.physical_size(meta.size)
            with self._cond:
                self._readonly = f"compacted into {new_id}"
                self._count = self._live = self._live_phys = 0
            return new

