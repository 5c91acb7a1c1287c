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

`ChunkFile` keeps the chunk's state (write offset, pending puts, counts) and its writes and deletes; the rest is
beside it: `recovery.py` (what `open` rebuilds), `reads.py` (verified reads), `compaction.py` (the copy and the
index move), `fileio.py` (pwritev, O_DIRECT and its staging buffers).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from isal.isal_zlib import crc32

from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.ids import ChunkId

from . import format as fmt
from .commit import GroupCommit, StagedPut
from .compaction import copy_shards, move_index
from .errors import ChunkCorrupted, ChunkError, ChunkFull, ChunkReadOnly, CrcMismatch, ShardCorrupted, ShardExists
from .fileio import DIRECT_ALIGN, Descriptors, fsync_dir, pwritev_all, staging
from .index import ShardIndex, ShardMeta, ShardStatus, check_bid
from .punch import punch_hole
from .reads import NotCached, Read, ShardReader, bounds
from .recovery import Recovered, recover

SyncObserver = Callable[[float], object]  # told the seconds each fdatasync of shard bytes took


@dataclass(frozen=True)
class ChunkStats:
    shard_count: int
    live_bytes: int  # sum of the data sizes of indexed shards (incl. mark-deleted)
    physical_bytes: int  # sum of their 4 KiB-aligned extents
    write_offset: int  # where the next shard goes
    punched_bytes: int  # bytes below write_offset owned by no indexed shard (punched or abandoned)
    disk_bytes: int  # st_blocks * 512: what the file really occupies


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
        self._fds = Descriptors(self.path, fd)
        self.commits = commits or GroupCommit(kv)
        self._index = ShardIndex(kv, chunk_id)
        self._reader = ShardReader(self._fds, self._index, chunk_id, self.tag)
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
                fsync_dir(path.parent)
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
            chunk._count_recovered(recover(chunk._reader, kv, sync=sync))
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

    def _count_recovered(self, recovered: Recovered) -> None:
        for meta in recovered.shards:
            self._count_in(meta)
        self._write_off = self._watermark = recovered.end

    def _count_in(self, meta: ShardMeta) -> None:
        self._count += 1
        self._live += meta.size
        self._live_phys += fmt.physical_size(meta.size)

    def close(self) -> None:
        """Wait for running operations, then close the file descriptor (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.wait_for(lambda: self._users == 0)
        self._fds.close()

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
        direct_fd = self._fds.direct() if direct else None
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
            pwritev_all(self._fds.fd, bufs, offset)
        else:
            image = staging.image(bufs, fmt.align_up(phys, DIRECT_ALIGN))
            if os.pwrite(direct_fd, image, offset) != len(image):
                raise OSError(errno.EIO, f"short direct write at offset {offset} of chunk {self.chunk_id}")

    def sync_data(self) -> None:
        """fdatasync the chunk's bytes (a no-op without `sync`); after one failed, every later one fails too:
        a retried fdatasync may report success for pages the failed one dropped."""
        if self._broken is not None:
            raise ChunkError(f"chunk {self.chunk_id}: a sync failed earlier") from self._broken
        if self.sync:
            started = time.perf_counter()
            os.fdatasync(self._fds.fd)
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
        offset = fmt.align_up(self._write_off, align)
        end = offset + fmt.align_up(phys, align)
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
        if same_sum and self._reader.read_range(existing, 0, existing.size) == view:
            return existing
        raise ShardExists(f"bid {existing.bid} already stored in chunk {self.chunk_id} with other bytes")

    # ------------------------------------------------------------ reads

    def stat_shard(self, bid: int) -> ShardMeta:
        return self._reader.stat(bid)

    def read_shard(self, bid: int, offset: int = 0, size: int | None = None) -> memoryview:
        """Bytes [offset, offset+size) of a shard, read-only; verifies only the 64 KiB blocks they touch."""
        with self._use():
            meta = self._reader.readable(bid)
            lo, hi = bounds(meta, offset, size)
            return self._reader.read_checked(meta, lo, hi)

    def shard_intact(self, bid: int) -> bool:
        """Whether the whole shard (of any status) passes its CRCs: a blobnode takes a discard of a live unit's shard
        without a ticket only for one that does not (it is lost already)."""
        with self._use():
            meta = self.stat_shard(bid)
            try:
                self._reader.read_range(meta, 0, meta.size)
            except (ShardCorrupted, ChunkCorrupted):
                return False
            return True

    def read_cached(self, bid: int, offset: int, size: int | None, limit: int
                    ) -> tuple[ShardMeta, memoryview | None]:
        """`read_shard` for an event loop, which must not wait on the disk: the bytes when the range is at most
        `limit` long and all of it is in the page cache (an `RWF_NOWAIT` read), else None, with the meta either
        way. Lookup and range errors raise as in `read_shard`."""
        with self._use():
            meta = self._reader.readable(bid)
            lo, hi = bounds(meta, offset, size)
            if hi - lo > limit:
                return meta, None
            try:
                return meta, self._reader.read_checked(meta, lo, hi, Read.CACHED)
            except NotCached:
                return meta, None

    def iter_shard(self, bid: int, offset: int = 0, size: int | None = None,
                   piece: int = 1 << 20, direct: bool = False) -> Iterator[memoryview]:
        """Like read_shard in block-aligned pieces. Lookup and range errors raise at call time. `direct` (for
        background reads: repair, migration, scrubbing) reads past the page cache (O_DIRECT, through this
        thread's staging buffer): bytes read once are not worth fresh cache pages (~1.4 ms of CPU per MB here,
        against 0.04 direct), nor pushing out the pages users read."""
        with self._use():
            meta = self._reader.readable(bid)
            lo, hi = bounds(meta, offset, size)
        step = max(fmt.BLOCK_SIZE, piece // fmt.BLOCK_SIZE * fmt.BLOCK_SIZE)
        return self._pieces(meta, lo, hi, step, Read.DIRECT if direct else Read.WAIT)

    def _pieces(self, meta: ShardMeta, lo: int, hi: int, step: int, how: Read) -> Iterator[memoryview]:
        if lo == hi and meta.size:
            return
        while True:
            end = min(hi, (lo // step + 1) * step)
            with self._use():
                yield self._reader.read_checked(meta, lo, end, how)
            lo = end
            if lo >= hi:
                return

    def verify_shard(self, bid: int) -> ShardMeta:
        """Check header, every block and the footer (mark-deleted shards too); for scrubbing."""
        with self._use():
            meta = self.stat_shard(bid)
            data = self._reader.read_checked(meta, 0, meta.size)
            if crc32(data) != meta.crc:
                raise ShardCorrupted(f"bid {bid}: shard crc mismatch against the index")
            return meta

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
            punch_hole(self._fds.fd, meta.offset, phys)

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
            blocks = os.fstat(self._fds.fd).st_blocks
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
                moved = copy_shards(self._reader, self._index.scan(), new.tag, new._append)
                new.sync_data()
                move_index(self.kv, moved, self._index, new._index, before_commit)
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
                    new._count_in(meta)
            with self._cond:
                self._readonly = f"compacted into {new_id}"
                self._count = self._live = self._live_phys = 0
            return new

    def _append(self, bufs: list[memoryview | bytes], phys: int) -> int:
        """Write a shard's encoded bytes past the last, neither synced, indexed nor counted (a compaction's copy):
        its offset."""
        with self._cond:
            offset = self._reserve(phys)
            self._inflight -= phys
        pwritev_all(self._fds.fd, bufs, offset)
        return offset
