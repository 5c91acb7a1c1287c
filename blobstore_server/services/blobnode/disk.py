"""One disk of a blobnode: its on-disk layout, its chunks, and the thread pool its I/O runs in.

Layout (docs/architecture.md, "On disk"): `.sys/format.json` names the disk; `meta/` is the disk's RocksDB
(chunk records and the shard index); `data/<chunk_id>` are chunk files; `.trash/` holds released or
compacted-away chunk files until their hold is over (services/blobnode/trash.py). Every method here blocks; the
node (node.py) runs them in `self.executor`, one pool per disk, so a slow disk stalls only itself; background I/O
runs in `self.background_executor`, so user I/O never waits behind it in a queue.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, TypeVar, overload

from blobstore_server.libs.chunkfile import (
    ChunkError,
    ChunkFile,
    ChunkId,
    GroupCommit,
    ShardHeld,
    ShardMeta,
    ShardNotMarkDeleted,
    ShardStatus,
    StagedPut,
    required_column_families,
)
from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.blobnode import (
    MARK_GRANULARITY,
    ChunkInfo,
    ChunkStat,
    ChunkStatus,
    DiskStat,
    TaskFence,
)
from blobstore_server.libs.proto.ids import epoch_of
from blobstore_server.libs.rpc.errors import (
    ChunkExists,
    ChunkNotFound,
    ChunkReadonly,
    NoSpace,
    StaleEpoch,
    TicketRefused,
)
from blobstore_server.services.blobnode.fence import check_scheduler_epoch, check_task_token, fenced_for_task
from blobstore_server.services.blobnode.metrics import FSYNC_SECONDS
from blobstore_server.services.blobnode.rwlock import RWLock
from blobstore_server.services.blobnode.trash import TRASH_DIR, TrashEntry, TrashReason, trash_entry, trash_name

CHUNK_CF = "chunk"
FENCE_CF = "fence"
SCHEDULER_EPOCH_KEY = b"scheduler_epoch"  # in FENCE_CF: the highest scheduler lease epoch seen (8 bytes, big-endian)
FORMAT_VERSION = 1
T = TypeVar("T")


class DiskFormatError(Exception):
    """The disk's format file is missing, damaged or belongs to another disk or cluster."""


def _lower_priority(steps: int) -> None:
    """Run the calling thread `steps` nice levels below its process (Linux nice is per thread): a disk's
    background threads (repair, migration, scrub, compaction I/O and their Python glue) then yield the CPU to
    the threads serving users, where they compete for it."""
    thread = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + steps))


def delete_wait(marked_at: int, hold: float, now: float) -> float:
    """Seconds until a shard marked deleted at `marked_at` (unix seconds; 0: unknown, an index entry older than the
    field) may be deleted for good, `hold` seconds after its mark; 0 when it may be now. The index keeps the whole
    second the mark fell in, so the hold counts from that second's end: never cut short."""
    return 0.0 if marked_at == 0 or hold <= 0 else max(0.0, marked_at + MARK_GRANULARITY + hold - now)


def check_epoch(record: ChunkInfo, vuid: int, disk_id: int) -> None:
    """Whether the chunk `record` serves `vuid`: an older epoch means the caller's view of the volume is stale
    (409); a newer one means this disk never got that unit (404)."""
    have, want = epoch_of(record.vuid), epoch_of(vuid)
    if want < have:
        raise StaleEpoch(f"vuid {vuid} has epoch {want}; the chunk on disk {disk_id} is at {have}")
    if want > have:
        raise ChunkNotFound(f"disk {disk_id} holds vuid {record.vuid}, not the newer {vuid}")


def _record_bytes(record: ChunkInfo) -> bytes:
    return record.model_dump_json().encode()


def unit_key(vuid: int) -> bytes:
    """Chunk records are keyed by (vid, unit index): one live chunk per unit, whatever the epoch."""
    return (vuid >> 24).to_bytes(8, "big")


def _format_checksum(fields: dict[str, object]) -> int:
    return zlib.crc32(json.dumps(fields, sort_keys=True).encode())


def format_disk(path: Path, disk_id: int, cluster_id: int) -> None:
    """Write `.sys/format.json` atomically: a half-written format file never names a disk."""
    sys_dir = path / ".sys"
    sys_dir.mkdir(parents=True, exist_ok=True)
    fields: dict[str, object] = {"version": FORMAT_VERSION, "disk_id": disk_id, "cluster_id": cluster_id,
                                 "format_time": time.time()}
    payload = json.dumps({**fields, "checksum": _format_checksum(fields)}).encode()
    tmp = sys_dir / "format.json.tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, sys_dir / "format.json")
    for sub in ("meta", "data", TRASH_DIR):
        (path / sub).mkdir(exist_ok=True)


@dataclass(frozen=True)
class DiskFormat:
    version: int
    disk_id: int
    cluster_id: int
    format_time: float


def read_format(path: Path) -> DiskFormat:
    try:
        fields = json.loads((path / ".sys" / "format.json").read_text())
    except FileNotFoundError:
        raise DiskFormatError(f"{path} is not formatted") from None
    except json.JSONDecodeError as exc:
        raise DiskFormatError(f"{path}/.sys/format.json is damaged: {exc}") from None
    checksum = fields.pop("checksum", None)
    if checksum != _format_checksum(fields):
        raise DiskFormatError(f"{path}/.sys/format.json fails its checksum")
    try:
        return DiskFormat(**fields)
    except TypeError as exc:
        raise DiskFormatError(f"{path}/.sys/format.json has unexpected fields: {exc}") from None


class Disk:
    """A formatted, loaded disk with its open chunks."""

    def __init__(self, path: Path, disk_id: int, *, max_chunks: int, sync: bool, io_threads: int,
                 background_threads: int = 1, background_nice: int = 0) -> None:
        self.path = path
        self.disk_id = disk_id
        self.max_chunks = max_chunks
        self.sync = sync
        self.on_sync = FSYNC_SECONDS.labels(str(disk_id)).observe
        self.executor = ThreadPoolExecutor(io_threads, thread_name_prefix=f"disk{disk_id}")
        self.background_executor = ThreadPoolExecutor(background_threads, thread_name_prefix=f"disk{disk_id}-bg",
                                                      initializer=_lower_priority, initargs=(background_nice,))
        self.kv = KVStore(path / "meta", [CHUNK_CF, FENCE_CF, *required_column_families()], sync=sync)
        self._scheduler_lock = threading.Lock()  # one scheduler's change at a time: checked and applied together
        self.scheduler_epoch = int.from_bytes(self.kv.get(FENCE_CF, SCHEDULER_EPOCH_KEY) or b"", "big")
        self.commits = GroupCommit(self.kv)
        self._lock = threading.Lock()  # guards the chunk tables
        self._records: dict[bytes, ChunkInfo] = {}
        self._chunks: dict[bytes, ChunkFile] = {}
        self._unit_locks: dict[bytes, RWLock] = {}
        self._copying: set[bytes] = set()  # units whose chunk a compaction copies: their reads need not wait
        for key, raw in self.kv.items(CHUNK_CF):
            record = ChunkInfo.model_validate_json(raw)
            self._records[key] = record
            self._unit_locks[key] = RWLock()
            if record.status is not ChunkStatus.RELEASED:
                self._chunks[key] = ChunkFile.open(self._data_path(record.chunk_id), self.kv,
                                                   ChunkId.parse(record.chunk_id), sync=sync, on_sync=self.on_sync,
                                                   commits=self.commits)

    @classmethod
    def load(cls, path: Path, *, cluster_id: int, disk_id: int | None, auto_format: bool,
             max_chunks: int, sync: bool, io_threads: int, background_threads: int = 1,
             background_nice: int = 0) -> Disk:
        path.mkdir(parents=True, exist_ok=True)
        if not (path / ".sys" / "format.json").exists():
            if not auto_format:
                raise DiskFormatError(f"{path} is not formatted and auto_format is off")
            if disk_id is None:
                raise DiskFormatError(f"{path} is not formatted and no disk_id is configured for it")
            format_disk(path, disk_id, cluster_id)
        found = read_format(path)
        if found.cluster_id != cluster_id:
            raise DiskFormatError(f"{path} belongs to cluster {found.cluster_id}, not {cluster_id}")
        if disk_id is not None and found.disk_id != disk_id:
            raise DiskFormatError(f"{path} is disk {found.disk_id}, config says {disk_id}")
        return cls(path, found.disk_id, max_chunks=max_chunks, sync=sync, io_threads=io_threads,
                   background_threads=background_threads, background_nice=background_nice)

    def _data_path(self, chunk_id: str) -> Path:
        return self.path / "data" / chunk_id

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.background_executor.shutdown(wait=True)
        self.commits.close()
        for chunk in self._chunks.values():
            chunk.close()
        self.kv.close()

    # chunks

    def _record(self, vuid: int) -> ChunkInfo:
        record = self._records.get(unit_key(vuid))
        if record is None or record.status is ChunkStatus.RELEASED:
            raise ChunkNotFound(f"disk {self.disk_id} has no chunk for vuid {vuid}")
        return record

    def chunk_for(self, vuid: int, *, write: bool) -> ChunkFile:
        """The chunk serving `vuid`, fenced by epoch (`check_epoch`)."""
        record = self._record(vuid)
        check_epoch(record, vuid, self.disk_id)
        if write and record.status is not ChunkStatus.NORMAL:
            raise ChunkReadonly(f"chunk for vuid {vuid} is {record.status}")
        return self._chunks[unit_key(vuid)]

    def unit_lock(self, vuid: int) -> RWLock:
        self._record(vuid)
        return self._unit_locks[unit_key(vuid)]

    def create_chunk(self, vuid: int, chunk_size: int, for_task: bool = False) -> ChunkInfo:
        """`for_task`: a scheduler's, a task's destination (its task fence may open: `fence.fenced_for_task`)."""
        key = unit_key(vuid)
        with self._lock:
            existing = self._records.get(key)
            if existing is not None and existing.status is not ChunkStatus.RELEASED:
                if existing.vuid == vuid:
                    return existing  # a retried create is harmless
                raise ChunkExists(f"disk {self.disk_id} already holds vuid {existing.vuid} for this unit")
            live = sum(r.status is not ChunkStatus.RELEASED for r in self._records.values())
            if live >= self.max_chunks:
                raise NoSpace(f"disk {self.disk_id} has its maximum of {self.max_chunks} chunks")
            chunk_id = ChunkId(vuid, time.time_ns())
            chunk = ChunkFile.create(self._data_path(str(chunk_id)), self.kv, chunk_id, sync=self.sync,
                                     max_size=chunk_size, on_sync=self.on_sync, commits=self.commits)
            record = ChunkInfo(chunk_id=str(chunk_id), vuid=vuid, status=ChunkStatus.NORMAL, chunk_size=chunk_size,
                               created=time.time(), task_fence=TaskFence.READY if for_task else TaskFence.NONE)
            self.kv.put(CHUNK_CF, key, _record_bytes(record))
            self._records[key] = record
            self._chunks[key] = chunk
            self._unit_locks[key] = RWLock()
            return record

    def set_chunk_status(self, vuid: int, status: ChunkStatus) -> ChunkInfo:
        """Under the unit's lock: a compaction under way (it holds the lock) would otherwise commit the record it
        read at its start over this change, or this one the old chunk's record over the compaction's."""
        key = unit_key(vuid)
        with self.unit_lock(vuid).exclusive(), self._lock:
            record = self._record(vuid)
            if record.vuid != vuid:
                raise StaleEpoch(f"vuid {vuid} is not the chunk's current vuid {record.vuid}")
            if status is ChunkStatus.RELEASED:
                chunk = self._chunks.pop(key)
                chunk.remove_index()
                chunk.close()
                self._move_to_trash(record.chunk_id)
            record.status = status
            self.kv.put(CHUNK_CF, key, _record_bytes(record))
            return record

    def scheduler_change(self, epoch: int | None, change: Callable[[], T]) -> T:
        """Apply `change`, a chunk state change a scheduler sent under its lease's `epoch`, unless the disk has seen
        a newer epoch (`fence.check_scheduler_epoch`); a newer one is made durable first. None: not a scheduler's
        (clustermgr's, for a volume it creates), applied as is."""
        with self._scheduler_lock:
            if epoch is not None:
                check_scheduler_epoch(self.scheduler_epoch, epoch, self.disk_id)
                if epoch > self.scheduler_epoch:
                    self.kv.put(FENCE_CF, SCHEDULER_EPOCH_KEY, epoch.to_bytes(8, "big"))
                    self.scheduler_epoch = epoch
            return change()

    def set_task_fence(self, vuid: int, token: int | None) -> ChunkInfo:
        """Open the chunk's task fence at `token`, or close it (None): `fence.fenced_for_task`. It waits for the
        unit's discards under way, so none checked against the fence before it changed runs after."""
        key = unit_key(vuid)
        with self.unit_lock(vuid).exclusive(), self._lock:
            record = self._record(vuid)
            if record.vuid != vuid:
                raise StaleEpoch(f"vuid {vuid} is not the chunk's current vuid {record.vuid}")
            updated = fenced_for_task(record, token)
            if updated is not record:
                self.kv.put(CHUNK_CF, key, _record_bytes(updated))
                self._records[key] = updated
            return updated

    def _move_to_trash(self, chunk_id: str, why: TrashReason = TrashReason.RELEASED) -> None:
        src = self._data_path(chunk_id)
        if src.exists():
            (self.path / TRASH_DIR).mkdir(exist_ok=True)
            os.replace(src, self.path / TRASH_DIR / trash_name(chunk_id, why, time.time()))

    def compact_chunk(self, vuid: int) -> ChunkInfo:
        """Rewrite the chunk without its deleted shards; writes, marks and deletes on it wait meanwhile, reads go on
        from the old file until the new one is committed. The new chunk record and the moved shard index commit in
        one batch. A stream still reading the old chunk fails after this (its reader falls back to other shards),
        it never reads the wrong bytes."""
        key = unit_key(vuid)
        lock = self.unit_lock(vuid)
        with self._lock:  # already while the lock is awaited: reads that would queue behind it go on
            self._copying.add(key)
        try:
            with lock.exclusive():
                old = self.chunk_for(vuid, write=False)
                record = self._records[key]
                new_id = ChunkId(vuid, time.time_ns())
                updated = record.model_copy(update={"chunk_id": str(new_id), "created": time.time()})

                def before_commit(batch: Batch) -> None:
                    with self._lock:  # reads from here on wait for the new chunk
                        self._copying.discard(key)
                    batch.put(CHUNK_CF, key, _record_bytes(updated))

                new = old.compact_into(self._data_path(str(new_id)), new_id, before_commit=before_commit)
                with self._lock:
                    self._records[key] = updated
                    self._chunks[key] = new
        finally:
            with self._lock:
                self._copying.discard(key)
        old.close()  # once the reads still on it are done
        self._move_to_trash(record.chunk_id, TrashReason.COMPACTED)
        return updated

    def list_chunks(self) -> list[ChunkInfo]:
        with self._lock:
            return [r for r in self._records.values() if r.status is not ChunkStatus.RELEASED]

    def chunk_stat(self, vuid: int) -> ChunkStat:
        record = self._record(vuid)
        stats = self._chunks[unit_key(vuid)].stats()
        return ChunkStat(**record.model_dump(), **asdict(stats), disk_id=self.disk_id)

    def chunk_stats(self) -> list[ChunkStat]:
        """Every live chunk's stat (one released or compacted away meanwhile is left out)."""
        found = []
        for record in self.list_chunks():
            with contextlib.suppress(ChunkError, ChunkNotFound, StaleEpoch):
                found.append(self.chunk_stat(record.vuid))
        return found

    # shards

    def put_shard(self, vuid: int, bid: int, data: bytes | bytearray | memoryview,
                  expected_crc: int | None = None, direct: bool = False) -> ShardMeta:
        return self.commits.stored(self.stage_put(vuid, bid, data, expected_crc=expected_crc, direct=direct))

    def stage_put(self, vuid: int, bid: int, data: bytes | bytearray | memoryview, *,
                  blocking: bool = True, expected_crc: int | None = None, direct: bool = False
                  ) -> ShardMeta | StagedPut | None:
        """`ChunkFile.stage_put` on the unit's chunk. The unit lock is held only while staging: a compaction
        that starts after it still waits for the staged put (it waits for every pending put)."""
        lock = self.unit_lock(vuid)
        if not lock.acquire_shared(blocking):
            return None
        try:
            return self.chunk_for(vuid, write=True).stage_put(bid, vuid, data, blocking=blocking,
                                                              expected_crc=expected_crc, direct=direct)
        finally:
            lock.release_shared()

    @overload
    def read_chunk(self, vuid: int, blocking: Literal[True] = True) -> ChunkFile: ...

    @overload
    def read_chunk(self, vuid: int, blocking: bool) -> ChunkFile | None: ...

    def read_chunk(self, vuid: int, blocking: bool = True) -> ChunkFile | None:
        """The chunk to read from. While a compaction copies it, the old one (its shards stay where they are until
        the copy commits); once the copy commits, the new one, after the swap. Without `blocking`, None rather than
        wait for that swap."""
        lock = self.unit_lock(vuid)
        if not lock.acquire_shared(False):
            with self._lock:
                copying = unit_key(vuid) in self._copying
            if copying:
                return self.chunk_for(vuid, write=False)
            if not blocking:
                return None
            lock.acquire_shared()
        try:
            return self.chunk_for(vuid, write=False)
        finally:
            lock.release_shared()

    def shard_status(self, vuid: int, bid: int, status: ShardStatus | None, hold: float = 0.0) -> ShardMeta | None:
        """Mark-delete (status MARK_DELETED), undo it (NORMAL), or delete for good (None) a shard marked at least
        `hold` seconds ago."""
        with self.unit_lock(vuid).shared():
            chunk = self.chunk_for(vuid, write=False)
            if status is None:
                meta = chunk.stat_shard(bid)
                if meta.status is not ShardStatus.MARK_DELETED:
                    raise ShardNotMarkDeleted(f"bid {bid} of unit {vuid} is not marked deleted: mark it first")
                wait = delete_wait(meta.marked_at, hold, time.time())
                if wait > 0:
                    raise ShardHeld(f"bid {bid} of unit {vuid} is deleted for good only {hold:.0f} s after its mark "
                                    f"(this blobnode's delete_hold): {wait:.1f} s from now", wait)
                chunk.delete_shard(bid)
                return None
            if status is ShardStatus.MARK_DELETED:
                return chunk.mark_delete(bid)
            return chunk.unmark_delete(bid)

    def discard_shard(self, vuid: int, bid: int, task_token: int | None = None, corrupt_only: bool = False) -> None:
        """Delete a shard at once, if the chunk's task fence takes `task_token` (`fence.check_task_token`); with
        `corrupt_only` (a call with no task's ticket, on a blobnode with auth) only a shard that fails its CRCs."""
        with self.unit_lock(vuid).shared():
            chunk = self.chunk_for(vuid, write=False)
            check_task_token(self._records[unit_key(vuid)], task_token)
            if corrupt_only and chunk.shard_intact(bid):
                raise TicketRefused(f"bid {bid} of unit {int(vuid)} reads intact: discarding it takes a task's discard "
                                    "ticket (a repair discards only a shard that fails its checksums)")
            chunk.delete_shard(bid)

    def stored_bytes(self, from_vuid: int = 0) -> int:
        """Data bytes of the shards indexed on the disk (mark-deleted ones too) in the chunks of units `from_vuid`
        and up: what a scrub pass reads (from there on), about."""
        with self._lock:
            chunks = [chunk for key, chunk in self._chunks.items() if self._records[key].vuid >= from_vuid]
        total = 0
        for chunk in chunks:
            with contextlib.suppress(ChunkError):  # released or compacted away meanwhile
                total += chunk.stats().live_bytes
        return total

    def trash(self) -> list[TrashEntry]:
        """What `.trash/` holds now (nothing, if someone removed the folder: the next move there makes it again)."""
        found: list[TrashEntry] = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.path / TRASH_DIR) as files:
            for file in files:
                with contextlib.suppress(FileNotFoundError):  # purged, or taken out by hand, meanwhile
                    info = file.stat(follow_symlinks=False)
                    found.append(trash_entry(file.name, info.st_size, info.st_blocks * 512, info.st_ctime))
        return found

    def cut_trash(self, name: str, size: int) -> None:
        """Cut a file in `.trash/` down to `size` bytes, or (0) remove it; one taken out meanwhile is left alone."""
        path = self.path / TRASH_DIR / name
        with contextlib.suppress(FileNotFoundError):
            if size:
                os.truncate(path, size)
            else:
                path.unlink()

    def stat(self) -> DiskStat:
        usage = shutil.disk_usage(self.path)
        chunks = self.list_chunks()
        trash = self.trash()
        return DiskStat(disk_id=self.disk_id, path=str(self.path), size=usage.total, free=usage.free,
                        used=usage.used, chunks=len(chunks), max_chunks=self.max_chunks,
                        readonly_chunks=sum(r.status is ChunkStatus.READONLY for r in chunks),
                        scheduler_epoch=self.scheduler_epoch, trash_bytes=sum(e.disk_bytes for e in trash),
                        trash_files=len(trash))
