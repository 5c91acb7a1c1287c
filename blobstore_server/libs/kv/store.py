"""RocksDB (through rocksdict) with named column families, atomic batches and checkpoints.

Keys and values are raw bytes; callers own their encoding. Every write can be synced
(WAL fsync) so that an acknowledged update survives a power cut.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import cast

from rocksdict import AccessType, BlockBasedOptions, Checkpoint, ColumnFamily, Options, Rdict, WriteBatch, WriteOptions

DEFAULT_CF = "default"


class KVError(Exception):
    """A misuse of the store (unknown column family, closed store)."""


def _raw_items(db: Rdict, from_key: bytes) -> Iterator[tuple[bytes, bytes]]:
    """`db.items(from_key=...)` typed for raw mode: rocksdict's stubs give keys as the union of every
    pickle-mode key type (str | int | float | bytes | bool), but a raw_mode store only holds bytes."""
    return cast(Iterator[tuple[bytes, bytes]], db.items(from_key=from_key))


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    # Bloom filters (kept in memory with each table) answer most lookups of absent keys without reading a data
    # block: a blobnode looks a new shard's bid up from its event loop before writing it.
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


class Batch:
    """Mutations across column families applied atomically by `KVStore.write`."""

    def __init__(self, store: KVStore) -> None:
        self._store = store
        self._batch = WriteBatch(raw_mode=True)
        self.count = 0
        self._written: list[Callable[[], None]] = []

    def on_written(self, action: Callable[[], None]) -> None:
        """Run `action` once this batch is written (never, if it is dropped): how an in-memory view of the
        store follows exactly the writes that happened."""
        self._written.append(action)

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self._batch.put(key, value, self._store._handle(cf))
        self.count += 1

    def delete(self, cf: str, key: bytes) -> None:
        self._batch.delete(key, self._store._handle(cf))
        self.count += 1


class KVStore:
    """One RocksDB database. `sync=True` makes every write durable before `write` returns.

    A synced write is an unsynced write followed by a WAL sync (`flush_wal`), not RocksDB's own
    `sync=True` write: rocksdict holds the GIL through the latter's fsync, which stalled every other
    thread of the process (a blobnode's event loop above all), and releases it through the former.
    The one difference: other threads may read the update before the sync ends."""

    def __init__(self, path: str | os.PathLike[str], column_families: Iterable[str] = (),
                 *, sync: bool = True, secondary: str | os.PathLike[str] | None = None) -> None:
        """With `secondary` (a directory of its own for the secondary's logs), a read-only view of a database
        another process writes, as of its opening and of each `catch_up` since."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        names = set(column_families) | set(self._existing_cfs(self.path))
        names.discard(DEFAULT_CF)
        access = AccessType.read_write() if secondary is None else AccessType.secondary(str(secondary))
        self._db = Rdict(str(self.path), options=_options(), column_families={name: _options() for name in names},
                         access_type=access)
        self._cfs = {DEFAULT_CF: self._db}
        self._handles = {DEFAULT_CF: self._db.get_column_family_handle(DEFAULT_CF)}
        for name in names:
            self._cfs[name] = self._db.get_column_family(name)
            self._handles[name] = self._db.get_column_family_handle(name)
        self._write_opts = WriteOptions()
        self._sync = sync
        self._closed = False

    @staticmethod
    def _existing_cfs(path: Path) -> list[str]:
        if not (path / "CURRENT").exists():
            return []
        return list(Rdict.list_cf(str(path), _options()))

    @property
    def column_families(self) -> list[str]:
        return sorted(self._cfs)

    def _cf(self, cf: str) -> Rdict:
        if self._closed:
            raise KVError(f"store {self.path} is closed")
        try:
            return self._cfs[cf]
        except KeyError:
            raise KVError(f"unknown column family {cf!r}") from None

    def _handle(self, cf: str) -> ColumnFamily:
        self._cf(cf)
        return self._handles[cf]

    def get(self, cf: str, key: bytes) -> bytes | None:
        return self._cf(cf).get(key)

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        batch = self.batch()
        batch.put(cf, key, value)
        self.write(batch)

    def delete(self, cf: str, key: bytes) -> None:
        batch = self.batch()
        batch.delete(cf, key)
        self.write(batch)

    def batch(self) -> Batch:
        return Batch(self)

    def write(self, batch: Batch, *, sync: bool = True) -> None:
        """Apply `batch` atomically; durable on return when the store syncs and `sync` holds. Without the sync it
        is in the WAL as the OS holds it: it survives the process, not a power cut, unless a later sync covers it
        (the WAL is one sequence: syncing it makes every earlier write durable)."""
        if self._closed:
            raise KVError(f"store {self.path} is closed")
        self._db.write(batch._batch, self._write_opts)
        if self._sync and sync:
            self._db.flush_wal(True)
        for action in batch._written:
            action()

    def sync_wal(self) -> None:
        """Make every write so far durable (a no-op for a store that does not sync)."""
        if self._sync and not self._closed:
            self._db.flush_wal(True)

    def items(self, cf: str, start: bytes = b"", end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with start <= key < end, in key order."""
        for key, value in _raw_items(self._cf(cf), start):
            if end is not None and key >= end:
                return
            yield key, value

    def prefix_items(self, cf: str, prefix: bytes, after: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Keys starting with `prefix` in order, only those past `after` when given (a page marker)."""
        for key, value in _raw_items(self._cf(cf), max(prefix, after)):
            if not key.startswith(prefix):
                return
            if key != after:
                yield key, value

    def checkpoint(self, dest: str | os.PathLike[str]) -> Path:
        """A consistent, openable copy of the whole database (hard links where possible)."""
        dest = Path(dest)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        Checkpoint(self._db).create_checkpoint(str(dest))
        return dest

    def catch_up(self) -> None:
        """A secondary: see every write the primary has made so far (its WAL included)."""
        self._db.try_catch_up_with_primary()

    def flush(self) -> None:
        self._db.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            # Column-family views hold the database open; drop them before closing it.
            for name, cf in self._cfs.items():
                if name != DEFAULT_CF:
                    cf.close()
            self._cfs.clear()
            self._handles.clear()
            self._db.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
