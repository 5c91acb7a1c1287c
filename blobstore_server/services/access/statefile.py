"""What an access node owes and holds, kept in one local file (`state_file`) so that a crash does not forget it.

- The outbox's repair and leftover-delete messages: lost, a PUT's missing shards would stay missing until an
  inspection came by (about once a month on a large cluster). They are sent again at start; the repair and delete
  pipelines take a message twice without harm (a shard already rebuilt is left alone, one already deleted or
  marked stays so).
- The standby grants: lost, an access node restarted while the allocators are away answers every PUT 503. They
  are held again at start for what is left of their time (deadlines.py), never written on a bid taken before.

SQLite (stdlib) in WAL mode with synchronous=FULL: a transaction is on disk once committed (one fsync of the WAL),
one torn by a crash or a power cut is left out on open (WAL frames carry checksums and a commit marker), and the
file stays the size of what is held (pages of deleted rows are reused). One thread writes, every change queued
since its last commit in one transaction: whoever must know its change is on disk before going on (a PUT that
acknowledges a blob with shards to repair, a PUT about to write on bids of the standby stock) awaits that commit
(`on_disk`); the rest do not wait. One process per file: an exclusive lock on `<file>.lock`, dropped by the kernel
when the process dies (kill -9 too), is taken at open, and a second access node given the same file refuses to
start.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import queue
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.mqproxy import DeleteIn, RepairIn
from blobstore_server.services.access.deadlines import Clocks, SavedDeadline, left_after_restart, save_deadline
from blobstore_server.services.access.standby import Grant

log = logging.getLogger(__name__)

Message = RepairIn | DeleteIn
KINDS: dict[str, type[Message]] = {"repair": RepairIn, "delete": DeleteIn}
SCHEMA = ("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, cluster INTEGER NOT NULL, "
          "kind TEXT NOT NULL, body TEXT NOT NULL)",
          "CREATE TABLE IF NOT EXISTS grants (cluster INTEGER NOT NULL, first_bid INTEGER NOT NULL, "
          "body TEXT NOT NULL, PRIMARY KEY (cluster, first_bid))")
Statement = tuple[str, list[tuple[Any, ...]]]  # SQL and the rows it runs for
Saving = Future[None]  # done once the change is on disk; StateFileError if it could not be written


class StateFileInUse(Exception):
    """Another process holds the state file."""


class StateFileError(Exception):
    """A change could not be written to the state file."""


class SavedGrant(BaseModel):
    """A standby grant as the state file keeps it."""

    mode: CodeMode
    vid: int
    disks: tuple[int, ...]
    first_bid: int
    next_bid: int
    bids_left: int
    bytes_left: int
    deadline: SavedDeadline

    @classmethod
    def of(cls, mode: CodeMode, grant: Grant, now: float, clocks: Clocks) -> SavedGrant:
        """`grant` as held at `now` (the monotonic clock `usable_until` is on), read with `clocks`."""
        return cls(mode=mode, vid=grant.vid, disks=grant.disks, first_bid=grant.first_bid, next_bid=grant.next_bid,
                   bids_left=grant.bids_left, bytes_left=grant.bytes_left,
                   deadline=save_deadline(grant.usable_until - now, clocks))

    def grant(self, now: float, clocks: Clocks) -> Grant:
        """The grant to hold again in a process whose monotonic clock reads `now` (see deadlines.py)."""
        return Grant(vid=self.vid, disks=self.disks, first_bid=self.first_bid, next_bid=self.next_bid,
                     bids_left=self.bids_left, bytes_left=self.bytes_left,
                     usable_until=now + left_after_restart(self.deadline, clocks))


class StateFile:
    """The state file of one access node, every cluster it serves; open it once, at start (blocking I/O)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = _lock(path.with_name(path.name + ".lock"), path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        for table in SCHEMA:
            self._db.execute(table)
        self._messages: dict[int, list[tuple[int, Message]]] = defaultdict(list)
        self._grants: dict[int, list[SavedGrant]] = defaultdict(list)
        self._next_id = 1 + self._load()
        self._queue: queue.SimpleQueue[tuple[list[Statement], Saving] | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_rounds, name="state-file", daemon=True)
        self._writer.start()

    def _load(self) -> int:
        """Read what the file holds; the highest message id."""
        last = 0
        for message_id, cluster, kind, body in self._db.execute("SELECT id, cluster, kind, body FROM messages "
                                                                "ORDER BY id"):
            last = message_id
            try:
                self._messages[cluster].append((message_id, KINDS[kind].model_validate_json(body)))
            except (KeyError, ValidationError) as exc:
                log.error("state file %s: message %d (%s) cannot be read, left out: %s", self.path, message_id, kind,
                          exc)
        for cluster, first_bid, body in self._db.execute("SELECT cluster, first_bid, body FROM grants"):
            try:
                self._grants[cluster].append(SavedGrant.model_validate_json(body))
            except ValidationError as exc:
                log.error("state file %s: grant from bid %d cannot be read, left out: %s", self.path, first_bid, exc)
        return last

    def messages(self, cluster: int) -> list[tuple[int, Message]]:
        """The messages for `cluster` the file held at open, with their ids, oldest first."""
        return self._messages.pop(cluster, [])

    def grants(self, cluster: int) -> list[SavedGrant]:
        """The standby grants of `cluster` the file held at open."""
        return self._grants.pop(cluster, [])

    def unclaimed(self) -> list[int]:
        """Clusters whose messages or grants no `messages`/`grants` call took: this node no longer serves them."""
        return sorted({*self._messages, *self._grants})

    def add_messages(self, cluster: int, kind: str, messages: Sequence[Message]) -> tuple[list[int], Saving]:
        """Keep messages owed to `cluster`'s mqproxy; their ids (for `sent`)."""
        ids = list(range(self._next_id, self._next_id + len(messages)))
        self._next_id += len(messages)
        rows = [(i, cluster, kind, m.model_dump_json()) for i, m in zip(ids, messages, strict=True)]
        return ids, self._save([("INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?)", rows)])

    def sent(self, ids: Sequence[int]) -> Saving:
        """mqproxy took these messages."""
        return self._save([("DELETE FROM messages WHERE id = ?", [(i,) for i in ids])])

    def save_grants(self, cluster: int, kept: Sequence[SavedGrant], dropped: Sequence[int]) -> Saving:
        """Grants of `cluster` added or taken from, and the first bids of those let go."""
        return self._save([("INSERT OR REPLACE INTO grants VALUES (?, ?, ?)",
                            [(cluster, g.first_bid, g.model_dump_json()) for g in kept]),
                           ("DELETE FROM grants WHERE cluster = ? AND first_bid = ?",
                            [(cluster, first_bid) for first_bid in dropped])])

    def _save(self, statements: list[Statement]) -> Saving:
        saving: Saving = Future()
        if any(rows for _, rows in statements):
            self._queue.put((statements, saving))
        else:
            saving.set_result(None)
        return saving

    def _write_rounds(self) -> None:
        """Commit everything queued in one transaction, again and again: the commit the first change waits for
        carries every change queued meanwhile."""
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop once this round is written
                    break
                batch.append(item)
            self._commit(batch)

    def _commit(self, batch: list[tuple[list[Statement], Saving]]) -> None:
        try:
            self._db.execute("BEGIN")
            for statements, _ in batch:
                for sql, rows in statements:
                    if rows:
                        self._db.executemany(sql, rows)
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            log.error("state file %s: %d change(s) not written: %s", self.path, len(batch), exc)
            for _, saving in batch:
                saving.set_exception(StateFileError(f"state file {self.path}: {exc}"))
            return
        for _, saving in batch:
            saving.set_result(None)

    def close(self) -> None:
        """Write what is queued, then let the file go (blocking: call it off the event loop)."""
        self._queue.put(None)
        self._writer.join()
        self._db.close()
        os.close(self._lock)


async def on_disk(saving: Saving) -> None:
    """Wait until a change is on disk; StateFileError if it could not be written."""
    await asyncio.wrap_future(saving)


def _lock(lock_path: Path, path: Path) -> int:
    """Hold `lock_path` for this process (the kernel lets go when it exits); StateFileInUse if another holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateFileInUse(f"state file {path} is in use by process {holder}: every access node needs a "
                             f"`state_file` of its own") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
