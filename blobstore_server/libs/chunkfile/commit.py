"""Group commit for all chunk files of one disk: one fdatasync per chunk file touched and one index batch per
group, whichever chunks its puts went to.

The index batch (each shard's entry and each chunk's watermark) is not synced: the shards' own bytes are, and
they describe themselves, so a power cut that loses the index's unsynced tail loses no shard (`ChunkFile.open`
finds them past the watermark). Syncing it cost a third of a group's time and 30-40 of the 90-135 us of CPU a
10 KiB put cost (bench/index_sync.py). The index's WAL is still synced every `WAL_SYNC_EVERY` seconds while puts
come, which bounds what an open after a power cut has to read again. A chunk's watermark goes into the batch only
from puts already indexed by a written batch, and never lower than the index holds (`write_marked`, which a
delete's synced batch goes through too): `ChunkFile` says why.

A put first writes its bytes (`ChunkFile.stage_put`), then joins the next group. Whoever finds no group
being committed leads: it commits groups until none is waiting. A blocking caller leads in its own
thread (`commit`); an event loop queues with a callback (`submit`) and, when nobody leads, wakes the
commit's own thread to lead, so a busy disk costs one thread wakeup per group instead of several per
shard (the blobnode's profile was a third thread switching before this).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.ids import ChunkId

from .errors import ChunkError
from .index import ShardMeta

WAL_SYNC_EVERY = 1.0  # seconds
Done = Callable[[BaseException | None], object]  # told how a queued put ended: None once it is durable


class Committed(Protocol):
    """What a group commit needs of the chunk file a put went to (`ChunkFile`, chunk.py)."""

    chunk_id: ChunkId

    def sync_data(self) -> None: ...

    def index_into(self, batch: Batch, meta: ShardMeta) -> None: ...

    def watermark_into(self, batch: Batch, committing: Collection[int]) -> None: ...  # under `write_marked`'s lock

    def finish_put(self, staged: StagedPut, error: BaseException | None) -> None: ...


@dataclass(frozen=True)
class StagedPut:
    """A shard whose bytes are written but not yet durable nor indexed."""

    chunk: Committed
    meta: ShardMeta
    phys: int


class GroupCommit:
    def __init__(self, kv: KVStore) -> None:
        self.kv = kv
        self._lock = threading.Lock()
        self._queue: list[tuple[StagedPut, Done]] = []
        self._leading = False
        self._wake = threading.Condition(self._lock)  # the committer thread waits here for a lead to take
        self._handoff = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._wal_synced = time.monotonic()
        self._marking = threading.Lock()  # held from computing watermarks to writing them: see `write_marked`

    def enqueue(self, staged: StagedPut, done: Done) -> bool:
        """Queue `staged`; `done` is called from the leading thread. True: the caller must run `lead`."""
        return self._enqueue([(staged, done)])

    def _enqueue(self, puts: Sequence[tuple[StagedPut, Done]]) -> bool:
        with self._lock:
            self._queue.extend(puts)
            if self._leading:
                return False
            self._leading = True
            return True

    def submit(self, puts: Sequence[tuple[StagedPut, Done]]) -> None:
        """Queue `puts` together (they join the same group) without blocking the caller (an event loop): when
        nobody leads, this commit's own thread does. Each `done` is called from the leading thread."""
        if not self._enqueue(puts):
            return
        with self._wake:
            if not self._closed:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="group-commit", daemon=True)
                    self._thread.start()
                self._handoff = True
                self._wake.notify()
                return
        self.lead()  # closed (the disk is shutting down): nobody else will, and the chunk's close waits for it

    def _serve(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._handoff or self._closed)
                if not self._handoff:
                    return
                self._handoff = False
            self.lead()

    def close(self) -> None:
        """Stop the committer thread once it has led what was handed to it; sync what it indexed."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        self.kv.sync_wal()

    def lead(self) -> None:
        """Commit groups until none is waiting."""
        while True:
            with self._lock:
                group, self._queue = self._queue, []
                if not group:
                    self._leading = False
                    return
            self._commit(group)

    def commit(self, staged: StagedPut) -> None:
        """Make `staged` durable and indexed, blocking this thread until it is."""
        ended = threading.Event()
        outcome: list[BaseException | None] = []

        def done(exc: BaseException | None) -> None:
            outcome.append(exc)
            ended.set()

        if self.enqueue(staged, done):
            self.lead()
        ended.wait()
        if outcome[0] is not None:
            raise outcome[0]

    def stored(self, staged: ShardMeta | StagedPut | None) -> ShardMeta:
        """The meta of what a blocking `stage_put` gave: committed first when it was staged."""
        assert staged is not None  # a blocking stage always ends
        if isinstance(staged, ShardMeta):
            return staged
        self.commit(staged)
        return staged.meta

    def write_marked(self, batch: Batch, marks: Iterable[tuple[Committed, Collection[int]]], *, sync: bool) -> None:
        """Write `batch` with the watermark of each chunk in `marks` (with the bids `batch` indexes in it) computed
        into it. One lock spans computing and writing, so each chunk's watermark in the index never goes down (two
        writers computing in one order and writing in the other could lower it, and a lowered one lets an open
        after a power cut find again a deleted shard whose hole punch the cut lost). `sync`: the batch is synced,
        after the lock: no group waits for a delete's log sync."""
        with self._marking:
            for chunk, committing in marks:
                chunk.watermark_into(batch, committing)
            self.kv.write(batch, sync=False)
        if sync:
            self.kv.sync_wal()

    def _commit(self, group: list[tuple[StagedPut, Done]]) -> None:
        failed: dict[Committed, BaseException] = {}
        chunks = list(dict.fromkeys(staged.chunk for staged, _ in group))
        for chunk in chunks:
            try:
                chunk.sync_data()
            except BaseException as exc:  # handed to each of the chunk's writers, none left waiting
                failed[chunk] = exc
        indexed = [staged for staged, _ in group if staged.chunk not in failed]
        if indexed:
            batch = self.kv.batch()
            committing: dict[Committed, list[int]] = {}
            for staged in indexed:
                staged.chunk.index_into(batch, staged.meta)
                committing.setdefault(staged.chunk, []).append(staged.meta.bid)
            try:
                self.write_marked(batch, committing.items(), sync=False)
                if time.monotonic() - self._wal_synced >= WAL_SYNC_EVERY:
                    self.kv.sync_wal()
                    self._wal_synced = time.monotonic()
            except BaseException as exc:  # handed to every writer of the group
                failed.update(dict.fromkeys(chunks, exc))
        reported: set[int] = set()
        for staged, done in group:
            error = failed.get(staged.chunk)
            staged.chunk.finish_put(staged, error)
            done(error if error is None or _first(error, reported) else _shared(error, staged.chunk))


def _first(error: BaseException, reported: set[int]) -> bool:
    """Whether `error` goes out for the first time: that writer gets the failed call's own error (a blobnode counts
    each against its disk), the others of the group a `ChunkError` naming it."""
    if id(error) in reported:
        return False
    reported.add(id(error))
    return True


def _shared(error: BaseException, chunk: Committed) -> ChunkError:
    shared = ChunkError(f"chunk {chunk.chunk_id}: the commit of its group failed: {error}")
    shared.__cause__ = error
    return shared
