"""The blobnode's disks behind one async facade.

Each call runs on the named disk's own thread pool, and chunk-file errors become the typed RPC
errors of `libs.rpc.errors` here, once, so routes stay thin. Shard calls name their I/O class: user I/O
runs on the disk's user threads at once; background I/O waits for a slot of the disk's `BackgroundGate`
(`background`) and runs on the disk's background threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import importlib
import logging
import posixpath
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar
from urllib.parse import urlsplit

from blobstore_server.libs import chunkfile
from blobstore_server.libs.chunkfile import ShardMeta, ShardStatus, StagedPut
from blobstore_server.libs.proto.blobnode import (
    ChunkInfo,
    ChunkStat,
    ChunkStatus,
    DiskExport,
    DiskStat,
    ExportRequest,
    IOClass,
    NodeStat,
    ShardInfo,
)
from blobstore_server.libs.rpc import errors
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.disk import Disk
from blobstore_server.services.blobnode.faults import DiskFaults
from blobstore_server.services.blobnode.fence import WriteFence
from blobstore_server.services.blobnode.iolimit import BURST_SECONDS, AdaptiveRate, BackgroundGate, PaceRule
from blobstore_server.services.blobnode.metrics import CRC_FAILURES, WRITE_FENCE_REFUSALS, shard_op

P = ParamSpec("P")
log = logging.getLogger(__name__)
T = TypeVar("T")
Piece = TypeVar("Piece", bytes, memoryview)

_CHUNK_ERRORS: dict[type[Exception], type[errors.RpcError]] = {
    chunkfile.ShardNotFound: errors.ShardNotFound,
    chunkfile.ShardExists: errors.ShardExists,
    chunkfile.ShardCorrupted: errors.ShardCorrupted,
    chunkfile.ShardMarkDeleted: errors.ShardDeleted,
    chunkfile.RangeError: errors.RangeNotSatisfiable,
    chunkfile.ChunkFull: errors.ChunkFull,
    chunkfile.ChunkCorrupted: errors.ShardCorrupted,
    chunkfile.ChunkReadOnly: errors.ChunkReadonly,
    chunkfile.CrcMismatch: errors.BadRequest,
    chunkfile.ShardNotMarkDeleted: errors.Conflict,
    chunkfile.ShardHeld: errors.ShardHeld,
}


_CHECKSUM_ERRORS = (chunkfile.ShardCorrupted, chunkfile.ChunkCorrupted)
# A user shard up to this size is written into the page cache from the event loop (tens of microseconds)
# and only its sync runs on a disk thread, in a group with the disk's other puts; a larger one is written
# on a disk thread. The trade-off: a buffered write can sleep in the kernel's dirty-page throttling, and
# ext4 refuses RWF_NOWAIT for buffered writes; every put is synced within its group, so little stays dirty.
INLINE_BYTES = 64 << 10
MiB = 1 << 20
# A shard is read in pieces this large, each one trip to a disk thread (1 MiB pieces cost ~7% more CPU per
# 16 MiB GET, measured); its whole first piece is read before the answer's status goes out.
READ_PIECE = 4 << 20
# A user read up to one piece is served from the event loop when all of it is in the page cache (RWF_NOWAIT,
# which ext4 honours for reads): copying and checking cached bytes takes ~0.06 ms per MiB here, while the trip
# to a disk thread and back cost ~0.25 ms of CPU per shard read (16 MiB GET: ~23.5 -> ~21 ms CPU, measured).
INLINE_READ_BYTES = READ_PIECE
# I/O classes that skip the disk's background caps (urgent still runs on the background threads).
UNCAPPED = frozenset({IOClass.USER, IOClass.URGENT})
_PASS_THROUGH = nullcontext()  # what an uncapped request holds (reusable: it keeps no state)
_STATUS_OPS = {ShardStatus.MARK_DELETED: "markdelete", ShardStatus.NORMAL: "unmarkdelete", None: "delete"}


# A process out of file descriptors or memory: nothing wrong with the disk, which must not be reported broken
# for it (every unit on it would be rebuilt elsewhere).
_PROCESS_LIMITS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def chunk_rpc_error(exc: chunkfile.ChunkError) -> errors.RpcError:
    """The typed RPC error of a chunk error."""
    details = {"retry_after": exc.wait} if isinstance(exc, chunkfile.ShardHeld) else {}
    return _CHUNK_ERRORS.get(type(exc), errors.Internal)(str(exc), **details)


@contextmanager
def _translated(disk_id: int, faults: DiskFaults) -> Iterator[None]:
    """Chunk errors as typed RPC errors; a failed system call other than a full disk or a process limit counts
    against the disk in `faults` (enough of them in a while and the disk is reported broken)."""
    try:
        yield
    except chunkfile.ChunkError as exc:
        if isinstance(exc, _CHECKSUM_ERRORS):
            CRC_FAILURES.labels(str(disk_id)).inc()
        raise chunk_rpc_error(exc) from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise errors.NoSpace(f"disk full: {exc}") from exc
        if exc.errno in _PROCESS_LIMITS:
            raise errors.Unavailable(f"blobnode out of a resource, not a disk fault: {exc}") from exc
        faults.record(disk_id)
        raise errors.Internal(f"disk I/O failed: {exc}") from exc


def _call_translated(disk_id: int, faults: DiskFaults, fn: Callable[P, T], *args: P.args,
                     **kwargs: P.kwargs) -> T:
    with _translated(disk_id, faults):
        return fn(*args, **kwargs)


def _as_rpc_error(disk_id: int, faults: DiskFaults, error: BaseException) -> errors.RpcError:
    """The typed error `_translated` makes of `error` (which it counts against the disk as it would if raised)."""
    try:
        with _translated(disk_id, faults):
            raise error
    except errors.RpcError as translated:
        return translated
    except Exception as other:
        log.exception("a shard put failed unexpectedly")
        return errors.Internal(f"{type(other).__name__}: {other}")


@dataclass(frozen=True)
class ShardWrite:
    """One shard to store; `expected_crc` (signed by the caller) refuses bytes with another CRC unstored."""

    disk_id: int
    vuid: int
    bid: int
    data: memoryview
    expected_crc: int | None = None


@dataclass(frozen=True)
class ShardRead:
    """A range of one shard to read."""

    disk_id: int
    vuid: int
    bid: int
    offset: int
    size: int


async def ready(*pieces: Piece) -> AsyncIterator[Piece]:
    """An answer's pieces when they are all here already."""
    for piece in pieces:
        yield piece


async def stream_pieces(executor: Executor, first: memoryview | None, length: int,
                        next_piece: Callable[[], memoryview | None]) -> AsyncIterator[memoryview]:
    """A shard read's `length` bytes: the `first` piece, then each next one read on `executor`."""
    loop = asyncio.get_running_loop()
    piece, remaining = first, length
    while piece is not None:
        yield piece
        remaining -= len(piece)
        if remaining <= 0:
            return
        piece = await loop.run_in_executor(executor, next_piece)


def writes_direct(io_class: IOClass, size: int, direct_write_bytes: int) -> bool:
    """Whether a shard put skips the page cache (config `direct_write_bytes`; 0: none does)."""
    return direct_write_bytes > 0 and (io_class is not IOClass.USER or size >= direct_write_bytes)


def export_allowed(target: str, roots: list[str]) -> bool:
    """Whether `target` (a path or URI) lies inside one of `roots`, after resolving `..` and `.`."""
    def split(where: str) -> tuple[str, str, str]:
        parts = urlsplit(where if "://" in where else f"file://{where}")
        return parts.scheme, parts.netloc, posixpath.normpath(parts.path or "/")

    scheme, netloc, path = split(target)
    for root in roots:
        root_scheme, root_netloc, root_path = split(root)
        if (scheme, netloc) == (root_scheme, root_netloc) and posixpath.commonpath([path, root_path]) == root_path:
            return True
    return False


def shard_info(meta: ShardMeta) -> ShardInfo:
    return ShardInfo(bid=meta.bid, vuid=meta.vuid, offset=meta.offset, size=meta.size, crc=meta.crc,
                     status=meta.status.name.lower())


class Blobnode:
    def __init__(self, config: BlobnodeConfig) -> None:
        self.config = config
        self.disks: dict[int, Disk] = {}
        for disk_conf in config.disks:
            disk = Disk.load(Path(disk_conf.path), cluster_id=config.cluster_id, disk_id=disk_conf.disk_id,
                             auto_format=disk_conf.auto_format, max_chunks=disk_conf.max_chunks,
                             sync=config.sync, io_threads=config.io_threads_per_disk,
                             background_threads=config.background_concurrency,
                             background_nice=config.background_nice)
            if disk.disk_id in self.disks:
                raise ValueError(f"disk id {disk.disk_id} appears twice ({disk_conf.path})")
            self.disks[disk.disk_id] = disk
        self.io_pending = dict.fromkeys(self.disks, 0)  # per disk: calls queued or running on its threads
        self.write_fence = WriteFence(guarded=bool(config.clustermgr_hosts))  # opened by heartbeats' answers
        self.faults = DiskFaults(config.io_errors_broken, config.io_errors_window)
        ceiling = config.background_mb_per_sec * MiB
        self.gates = {disk_id: BackgroundGate(ceiling, config.background_concurrency, burst=ceiling * BURST_SECONDS)
                      for disk_id in self.disks}
        rule = PaceRule(floor=min(config.background_min_mb_per_sec * MiB, ceiling), ceiling=ceiling,
                        lag_limit=config.background_yield_lag_ms / 1000)
        self.background_rate = AdaptiveRate(list(self.gates.values()), rule)

    def close(self) -> None:
        for disk in self.disks.values():
            disk.close()

    def disk(self, disk_id: int) -> Disk:
        try:
            return self.disks[disk_id]
        except KeyError:
            raise errors.DiskNotFound(f"this node has no disk {disk_id}") from None

    def _executor(self, disk_id: int, io_class: IOClass) -> Executor:
        disk = self.disk(disk_id)
        return disk.executor if io_class is IOClass.USER else disk.background_executor

    def background(self, disk_id: int, io_class: IOClass) -> AbstractAsyncContextManager[object]:
        """Hold a background slot of the disk for a whole request (user and urgent I/O pass straight through, with
        no context of their own: this is on every shard request's path)."""
        self.disk(disk_id)
        if io_class in UNCAPPED:
            return _PASS_THROUGH
        self.background_rate.wake()
        return self.gates[disk_id].slot()

    def charge(self, disk_id: int, io_class: IOClass, amount: int) -> None:
        """Count bytes moved by a background request against the disk's rate."""
        if io_class not in UNCAPPED:
            self.gates[disk_id].charge(amount)

    async def _run_on(self, executor: Executor, disk_id: int, fn: Callable[P, T], *args: P.args,
                      **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        self.io_pending[disk_id] += 1
        try:
            call = functools.partial(_call_translated, disk_id, self.faults, fn, *args, **kwargs)
            return await loop.run_in_executor(executor, call)
        finally:
            self.io_pending[disk_id] -= 1

    async def _run(self, disk_id: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run_on(self._executor(disk_id, IOClass.USER), disk_id, fn, *args, **kwargs)

    async def _shard_op(self, op: str, disk_id: int, io_class: IOClass, fn: Callable[P, T], *args: P.args,
                        **kwargs: P.kwargs) -> T:
        """`_run` in the I/O class's lane, counted as one shard operation `op` of the disk."""
        try:
            result = await self._run_on(self._executor(disk_id, io_class), disk_id, fn, *args, **kwargs)
        except errors.RpcError:
            shard_op(disk_id, op, False).inc()
            raise
        shard_op(disk_id, op, True).inc()
        return result

    # chunks

    async def create_chunk(self, disk_id: int, vuid: int, chunk_size: int | None,
                           scheduler_epoch: int | None = None) -> ChunkInfo:
        size = chunk_size or self.config.default_chunk_size
        disk = self.disk(disk_id)
        return await self._run(disk_id, disk.scheduler_change, scheduler_epoch,
                               functools.partial(disk.create_chunk, vuid, size, for_task=scheduler_epoch is not None))

    async def set_chunk_status(self, disk_id: int, vuid: int, status: ChunkStatus,
                               scheduler_epoch: int | None = None) -> ChunkInfo:
        disk = self.disk(disk_id)
        return await self._run(disk_id, disk.scheduler_change, scheduler_epoch,
                               functools.partial(disk.set_chunk_status, vuid, status))

    async def set_task_fence(self, disk_id: int, vuid: int, scheduler_epoch: int, token: int | None) -> ChunkInfo:
        """Open the chunk's task fence at `token` or close it (None), as the scheduler of `scheduler_epoch` asks."""
        disk = self.disk(disk_id)
        return await self._run(disk_id, disk.scheduler_change, scheduler_epoch,
                               functools.partial(disk.set_task_fence, vuid, token))

    async def compact_chunk(self, disk_id: int, vuid: int) -> ChunkInfo:
        """Background work by nature: it rewrites the whole chunk, and the bytes it read and wrote count against
        the disk's background rate (the next background operation waits them off)."""
        async with self.background(disk_id, IOClass.BACKGROUND):
            compacted = await self._run_on(self._executor(disk_id, IOClass.BACKGROUND), disk_id,
                                           self.disk(disk_id).compact_chunk, vuid)
        self.charge(disk_id, IOClass.BACKGROUND, 2 * (await self.chunk_stat(disk_id, vuid)).live_bytes)
        return compacted

    async def list_chunks(self, disk_id: int) -> list[ChunkInfo]:
        return self.disk(disk_id).list_chunks()

    async def chunk_stat(self, disk_id: int, vuid: int) -> ChunkStat:
        return await self._run(disk_id, self.disk(disk_id).chunk_stat, vuid)

    # shards

    async def put_shard(self, disk_id: int, vuid: int, bid: int, data: memoryview,
                        io_class: IOClass = IOClass.USER, expected_crc: int | None = None) -> ShardMeta:
        """Store a shard; with `expected_crc` (signed by the caller) bytes with another CRC are refused unstored."""
        stored = (await self.put_shards([ShardWrite(disk_id, vuid, bid, data, expected_crc)], io_class))[0]
        if isinstance(stored, errors.RpcError):
            raise stored
        return stored

    async def put_shards(self, writes: Sequence[ShardWrite], io_class: IOClass = IOClass.USER
                         ) -> list[ShardMeta | errors.RpcError]:
        """Store shards, each with its own outcome in `writes`' order. Small user shards are written from the
        loop and each disk's share joins its group commit together (one sync of the disk for the lot); large,
        background, or ones that would have to wait go to a disk thread each."""
        outcomes: list[ShardMeta | errors.RpcError | None] = [None] * len(writes)
        staged: dict[Disk, list[tuple[int, StagedPut]]] = {}
        threaded: list[int] = []
        now = asyncio.get_running_loop().time()
        for i, write in enumerate(writes):
            try:
                disk = self.disk(write.disk_id)
            except errors.RpcError as exc:
                outcomes[i] = exc
                continue
            refused = self.write_fence.refusal(write.disk_id, now)
            if refused is not None:
                WRITE_FENCE_REFUSALS.labels(str(write.disk_id)).inc()
                outcomes[i] = refused
                continue
            self.charge(write.disk_id, io_class, len(write.data))
            if io_class is not IOClass.USER or len(write.data) > INLINE_BYTES:
                threaded.append(i)
                continue
            self.background_rate.user_request()
            try:
                put = disk.stage_put(write.vuid, write.bid, write.data, blocking=False,
                                     expected_crc=write.expected_crc)
            except (errors.RpcError, chunkfile.ChunkError, OSError) as exc:
                shard_op(disk.disk_id, "put", False).inc()
                outcomes[i] = _as_rpc_error(disk.disk_id, self.faults, exc)
                continue
            if isinstance(put, StagedPut):
                staged.setdefault(disk, []).append((i, put))
            elif isinstance(put, ShardMeta):
                shard_op(disk.disk_id, "put", True).inc()
                outcomes[i] = put
            else:  # the unit is locked (a compaction): wait for it on a disk thread
                threaded.append(i)
        waits = [self._commit(disk, puts, outcomes) for disk, puts in staged.items()]
        waits += [self._put_threaded(i, writes[i], io_class, outcomes) for i in threaded]
        if len(waits) == 1:
            await waits[0]
        elif waits:
            await asyncio.gather(*waits)
        settled = [outcome for outcome in outcomes if outcome is not None]
        assert len(settled) == len(writes)  # every path above settles its writes
        return settled

    async def _put_threaded(self, i: int, write: ShardWrite, io_class: IOClass,
                            outcomes: list[ShardMeta | errors.RpcError | None]) -> None:
        disk = self.disk(write.disk_id)
        try:
            outcomes[i] = await self._shard_op("put", write.disk_id, io_class, disk.put_shard, write.vuid, write.bid,
                                               write.data, write.expected_crc,
                                               writes_direct(io_class, len(write.data), self.config.direct_write_bytes))
        except errors.RpcError as exc:
            outcomes[i] = exc

    async def _commit(self, disk: Disk, puts: list[tuple[int, StagedPut]],
                      outcomes: list[ShardMeta | errors.RpcError | None]) -> None:
        """Wait for `puts` (by their place in `outcomes`) to be durable: queued together on the disk's group
        commit, so one group commits them all and the loop is woken once for the lot."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        reported: list[tuple[int, StagedPut, BaseException | None]] = []

        def settle() -> None:
            stored = 0
            for i, staged, error in reported:
                outcomes[i] = staged.meta if error is None else _as_rpc_error(disk.disk_id, self.faults, error)
                stored += error is None
            if stored:
                shard_op(disk.disk_id, "put", True).inc(stored)
            if stored < len(reported):
                shard_op(disk.disk_id, "put", False).inc(len(reported) - stored)
            if not ended.done():
                ended.set_result(None)

        def report(i: int, staged: StagedPut, error: BaseException | None) -> None:  # from the leading disk thread
            reported.append((i, staged, error))
            if len(reported) == len(puts):
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits anymore
                    loop.call_soon_threadsafe(settle)

        self.io_pending[disk.disk_id] += len(puts)
        try:
            disk.commits.submit([(staged, functools.partial(report, i, staged)) for i, staged in puts])
            await ended
        finally:
            self.io_pending[disk.disk_id] -= len(puts)

    async def open_shard_read(self, disk_id: int, vuid: int, bid: int, offset: int, size: int | None,
                              io_class: IOClass = IOClass.USER) -> tuple[ShardMeta, int, AsyncIterator[memoryview]]:
        """Validate a read and return (meta, length, pieces); pieces verify CRCs as they are read.

        The lookup and the first piece come from one trip to the disk's thread pool, so a small
        shard costs a single hop."""
        disk = self.disk(disk_id)
        if io_class is IOClass.USER:
            self.background_rate.user_request()
            cached = self._read_cached(disk, vuid, bid, offset, size)
            if cached is not None:
                return cached[0], len(cached[1]), ready(cached[1])

        def open_read() -> tuple[ShardMeta, Iterator[memoryview], memoryview | None]:
            chunk = disk.read_chunk(vuid)
            meta = chunk.stat_shard(bid)
            pieces = chunk.iter_shard(bid, offset, size, piece=READ_PIECE, direct=io_class is not IOClass.USER)
            return meta, pieces, next(pieces, None)

        meta, pieces, first = await self._shard_op("get", disk_id, io_class, open_read)
        length = meta.size - offset if size is None else size
        self.charge(disk_id, io_class, length)

        def next_piece() -> memoryview | None:
            with _translated(disk_id, self.faults):
                return next(pieces, None)

        return meta, length, stream_pieces(self._executor(disk_id, io_class), first, length, next_piece)

    async def read_shards(self, reads: Sequence[ShardRead]) -> list[memoryview | errors.RpcError]:
        """User reads, each with its own outcome in `reads`' order: those whose pages are all cached from the
        loop, the others each on a disk thread, together."""
        outcomes: list[memoryview | errors.RpcError | None] = [None] * len(reads)
        uncached: list[int] = []
        for i, read in enumerate(reads):
            try:
                disk = self.disk(read.disk_id)
                self.background_rate.user_request()
                cached = self._read_cached(disk, read.vuid, read.bid, read.offset, read.size)
            except errors.RpcError as exc:
                outcomes[i] = exc
                continue
            if cached is None:
                uncached.append(i)
            else:
                outcomes[i] = cached[1]
        if uncached:
            await asyncio.gather(*(self._read_threaded(i, reads[i], outcomes) for i in uncached))
        settled = [outcome for outcome in outcomes if outcome is not None]
        assert len(settled) == len(reads)  # every path above settles its reads
        return settled

    async def _read_threaded(self, i: int, read: ShardRead, outcomes: list[memoryview | errors.RpcError | None]
                             ) -> None:
        disk = self.disk(read.disk_id)

        def read_range() -> memoryview:
            return disk.read_chunk(read.vuid).read_shard(read.bid, read.offset, read.size)

        try:
            outcomes[i] = await self._shard_op("get", read.disk_id, IOClass.USER, read_range)
        except errors.RpcError as exc:
            outcomes[i] = exc

    def _read_cached(self, disk: Disk, vuid: int, bid: int, offset: int, size: int | None
                     ) -> tuple[ShardMeta, memoryview] | None:
        """A read of at most one piece whose pages are all cached, on the event loop; None: it needs a disk thread."""
        try:
            with _translated(disk.disk_id, self.faults):
                chunk = disk.read_chunk(vuid, blocking=False)
                if chunk is None:  # a compaction holds the unit
                    return None
                meta, data = chunk.read_cached(bid, offset, size, INLINE_READ_BYTES)
        except errors.RpcError:
            shard_op(disk.disk_id, "get", False).inc()
            raise
        if data is None:
            return None
        shard_op(disk.disk_id, "get", True).inc()
        return meta, data

    async def shard_stat(self, disk_id: int, vuid: int, bid: int, io_class: IOClass = IOClass.USER) -> ShardMeta:
        executor = self._executor(disk_id, io_class)
        chunk = await self._run_on(executor, disk_id, self.disk(disk_id).read_chunk, vuid)
        return await self._run_on(executor, disk_id, chunk.stat_shard, bid)

    async def list_shards(self, disk_id: int, vuid: int, start_bid: int, count: int | None,
                          status: ShardStatus | None, io_class: IOClass = IOClass.USER) -> list[ShardMeta]:
        executor = self._executor(disk_id, io_class)
        chunk = await self._run_on(executor, disk_id, self.disk(disk_id).read_chunk, vuid)
        return await self._run_on(executor, disk_id, chunk.list_shards, start_bid, count, status)

    async def set_shard_status(self, disk_id: int, vuid: int, bid: int, status: ShardStatus | None,
                               io_class: IOClass = IOClass.USER) -> ShardMeta | None:
        """Mark, unmark, or (None) delete for good a shard marked at least `delete_hold` seconds ago."""
        return await self._shard_op(_STATUS_OPS[status], disk_id, io_class, self.disk(disk_id).shard_status, vuid,
                                    bid, status, self.config.delete_hold)

    async def discard_shard(self, disk_id: int, vuid: int, bid: int, io_class: IOClass = IOClass.USER,
                            task_token: int | None = None, corrupt_only: bool = False) -> None:
        """Delete a shard at once, to write the right bytes in its place (repair, migration); a task's worker names
        its token (the chunk's task fence refuses a stale one); `corrupt_only`: only a shard failing its CRCs."""
        await self._shard_op("discard", disk_id, io_class, self.disk(disk_id).discard_shard, vuid, bid, task_token,
                             corrupt_only)

    async def export(self, req: ExportRequest) -> list[DiskExport]:
        """Write the shard index and chunk list of each disk under `req.target` (all disks at once), each bounded
        piece a background operation of its disk; see services/blobnode/export.py."""
        # pyarrow loads on first export only, and off the event loop (it takes a few hundred ms of CPU)
        await asyncio.to_thread(importlib.import_module, "blobstore_server.services.blobnode.export")
        from blobstore_server.libs.proto.export import open_target
        from blobstore_server.services.blobnode.export import INDEX_ENTRY_BYTES, DiskExporter

        if not export_allowed(req.target, self.config.export_roots):
            raise errors.Forbidden(f"export target {req.target!r} is not under this blobnode's export roots "
                                   f"({', '.join(self.config.export_roots) or 'none configured'})")
        disk_ids = sorted(self.disks) if req.disk_ids is None else req.disk_ids
        for disk_id in disk_ids:
            self.disk(disk_id)
        filesystem, base = open_target(req.target, self.config.export_bucket)

        async def one(disk_id: int) -> DiskExport:
            exporter = DiskExporter(self.disk(disk_id), filesystem, base, self.config.advertised_host, req.piece_rows)

            async def piece(fn: Callable[[], T]) -> T:
                async with self.background(disk_id, IOClass.BACKGROUND):
                    return await self._run_on(self._executor(disk_id, IOClass.BACKGROUND), disk_id, fn)

            try:
                await piece(exporter.begin)
                while not exporter.done:
                    self.charge(disk_id, IOClass.BACKGROUND, INDEX_ENTRY_BYTES * await piece(exporter.step))
                return await piece(exporter.finish)
            except BaseException:
                await self._run_on(self._executor(disk_id, IOClass.BACKGROUND), disk_id, exporter.abort)
                raise

        return list(await asyncio.gather(*(one(disk_id) for disk_id in disk_ids)))

    async def disk_stat(self, disk_id: int) -> DiskStat:
        return await self._run(disk_id, self.disk(disk_id).stat)

    async def stat(self) -> NodeStat:
        disks = [await self.disk_stat(disk_id) for disk_id in sorted(self.disks)]
        return NodeStat(host=self.config.advertised_host, cluster_id=self.config.cluster_id, idc=self.config.idc,
                        rack=self.config.rack, disks=disks)
