"""The store's plumbing: connections, one transaction per request, row codecs, and the steps several operations
share (finding a bucket, replacing an object, sending Locations to the GC outbox).

Connections are per thread: one store object may be called from any number of threads (asyncio.to_thread), each
gets its own connection on first use, and a connection is only ever used by the thread that opened it.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, TypeVar

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace.dialect import Connect, Dialect
from blobstore_server.services.s3.namespace.records import (
    Condition,
    Extent,
    IfMatch,
    IfNoneMatch,
    Intent,
    Manifest,
    ObjectMeta,
    ObjectRecord,
    bare_etag,
)

Row = tuple[Any, ...]
T = TypeVar("T")
MAX_KEY_BYTES = 1024


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def new_id(now_ms: int) -> str:
    """An app-generated id that sorts by creation time (a UUIDv7 in spirit: 48 bits of ms, 80 random bits)."""
    return f"{now_ms:012x}{secrets.token_hex(10)}"


def encode_manifest(manifest: Iterable[Extent]) -> str:
    """[offset, size, location] per extent, and its part when it has one (records written before parts were kept
    read as part 0)."""
    return json.dumps([[e.offset, e.size, e.location, *([e.part] if e.part else [])] for e in manifest],
                      separators=(",", ":"))


def decode_manifest(text: str) -> Manifest:
    return tuple(Extent(*fields) for fields in json.loads(text))


def encode_meta(meta: ObjectMeta) -> str:
    return json.dumps(asdict(meta), separators=(",", ":"))


def decode_meta(text: str) -> ObjectMeta:
    return ObjectMeta(**json.loads(text))


def check_key(key: bytes) -> None:
    if len(key) > MAX_KEY_BYTES:
        raise S3Error("KeyTooLongError", f"a key is at most {MAX_KEY_BYTES} bytes")
    if not key:
        raise S3Error("InvalidArgument", "an object key is not empty")


def _rollback(cursor: Any) -> None:
    """Roll back what is open (a failed COMMIT may have left the transaction open, or closed it)."""
    try:
        cursor.execute("ROLLBACK")
    except Exception:  # no transaction was open any more
        return


class Tx:
    """One transaction's statements, in the dialect's spelling."""

    def __init__(self, cursor: Any, dialect: Dialect) -> None:
        self._cursor, self._dialect = cursor, dialect

    def run(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; how many rows it changed."""
        self._cursor.execute(self._dialect.sql(statement), tuple(params))
        return int(self._cursor.rowcount)

    def many(self, statement: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [tuple(row) for row in rows]
        if rows:
            self._cursor.executemany(self._dialect.sql(statement), rows)

    def all(self, statement: str, params: Sequence[Any] = ()) -> list[Row]:
        self._cursor.execute(self._dialect.sql(statement), tuple(params))
        return [tuple(row) for row in self._cursor.fetchall()]

    def one(self, statement: str, params: Sequence[Any] = ()) -> Row | None:
        rows = self.all(statement, params)
        return rows[0] if rows else None


class StoreBase:
    """Connections, transactions and the shared steps; the operations are in NamespaceStore."""

    def __init__(self, connect: Connect, dialect: Dialect, gc_delay_ms: int = 60_000,
                 clock: Callable[[], int] = wall_ms) -> None:
        self.dialect, self.gc_delay_ms, self.clock = dialect, gc_delay_ms, clock
        self._connect = connect
        self._local = threading.local()
        self._opened: list[Any] = []
        self._opened_lock = threading.Lock()
        with self.transaction(write=True) as tx:
            for table in dialect.schema():
                tx.run(table)

    def close(self) -> None:
        """Close every connection the store opened (at shutdown, once no call is running)."""
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for db in opened:
            db.close()
        self._local = threading.local()

    def _connection(self) -> Any:
        db = getattr(self._local, "db", None)
        if db is None or self.dialect.broken(db):  # a server restart ends PostgreSQL's connections
            db = self._connect()
            self._local.db = db
            with self._opened_lock:
                self._opened.append(db)
        return db

    @contextmanager
    def transaction(self, write: bool) -> Iterator[Tx]:
        """One transaction, committed when the block ends (before the answer), rolled back if it raises."""
        cursor = self._connection().cursor()
        try:
            cursor.execute(self.dialect.begin_write if write else self.dialect.begin_read)
            try:
                yield Tx(cursor, self.dialect)
                cursor.execute("COMMIT")
            except BaseException:
                _rollback(cursor)
                raise
        except S3Error:
            raise
        except Exception as exc:
            code = self.dialect.s3_code(exc)
            if code is None:
                raise
            raise S3Error(code, "the namespace is busy, or a concurrent request changed this resource") from exc

    def bucket_id(self, tx: Tx, bucket: str) -> str:
        row = tx.one("SELECT id FROM buckets WHERE name = ?", (bucket,))
        if row is None:
            raise S3Error("NoSuchBucket", "the bucket does not exist", bucket)
        return str(row[0])

    def send_to_gc(self, tx: Tx, bucket_id: str, locations: Iterable[str]) -> None:
        """Blobs no object refers to any more: deleted once `gc_delay_ms` has passed (a GET that read the manifest
        before may still be reading them)."""
        not_before = self.clock() + self.gc_delay_ms
        tx.many("INSERT INTO gc (bucket_id, id, location, not_before_ms) VALUES (?, ?, ?, ?)",
                [(bucket_id, new_id(not_before), location, not_before) for location in locations])

    def check_intent(self, tx: Tx, bucket_id: str, intent: Intent) -> None:
        """An intent about to be committed is still there (a sweep gives up intents that took too long)."""
        if intent.bucket_id != bucket_id:
            raise S3Error("NoSuchBucket", "the bucket was deleted during the upload")
        if intent.opened and tx.one("SELECT 1 FROM intents WHERE bucket_id = ? AND id = ?{lock}",
                                    (bucket_id, intent.id)) is None:
            raise S3Error("InternalError", "the upload took too long and was given up; send it again")

    def drop_intent(self, tx: Tx, bucket_id: str, intent_id: str, to_gc: bool) -> bool:
        """Delete an intent; its blobs go to the GC outbox when `to_gc` (given up), else they are now an object's.
        The intent is locked first: a commit of it in flight decides whether its blobs are an object's."""
        tx.one("SELECT 1 FROM intents WHERE bucket_id = ? AND id = ?{lock}", (bucket_id, intent_id))
        if to_gc:
            rows = tx.all("SELECT location FROM intent_extents WHERE bucket_id = ? AND intent_id = ?",
                          (bucket_id, intent_id))
            self.send_to_gc(tx, bucket_id, (row[0] for row in rows))
        tx.run("DELETE FROM intent_extents WHERE bucket_id = ? AND intent_id = ?", (bucket_id, intent_id))
        return tx.run("DELETE FROM intents WHERE bucket_id = ? AND id = ?", (bucket_id, intent_id)) > 0

    def give_up(self, tx: Tx, intent: Intent) -> None:
        """A PUT that will not commit: every blob it stored, recorded or pending, goes to the GC outbox (the
        caller empties `pending` once this committed)."""
        self.drop_intent(tx, intent.bucket_id, intent.id, to_gc=True)
        self.send_to_gc(tx, intent.bucket_id, intent.pending)

    def settle_intent(self, bucket: str, intent: Intent | None, write: Callable[[Tx, str], T]) -> T:
        """One transaction that makes a PUT's blobs what `write(tx, bucket_id)` records (an object, a part) and
        closes its intent. If `write` or the checks refuse (an S3Error, raised before anything is written), the
        same transaction sends all the PUT's blobs to GC, and the error is raised once that committed."""
        refused: S3Error | None = None
        with self.transaction(write=True) as tx:
            try:
                bucket_id = self.bucket_id(tx, bucket)
                if intent is not None:
                    self.check_intent(tx, bucket_id, intent)
                result = write(tx, bucket_id)
                if intent is not None:
                    self.drop_intent(tx, bucket_id, intent.id, to_gc=False)
            except S3Error as exc:
                if intent is None:
                    raise
                refused = exc
                self.give_up(tx, intent)
        if intent is not None:  # committed: its blobs are an object's now, or in the GC outbox
            intent.opened, intent.pending = False, []
        if refused is not None:
            raise refused
        return result

    def replace_object(self, tx: Tx, bucket_id: str, record: ObjectRecord, condition: Condition) -> None:
        """Write `record` over whatever its key holds, if `condition` allows; the old object's blobs go to GC."""
        check_key(record.key)
        old = tx.one("SELECT etag, manifest FROM objects WHERE bucket_id = ? AND key = ?{lock}",
                     (bucket_id, record.key))
        if isinstance(condition, IfNoneMatch) and old is not None:
            raise S3Error("PreconditionFailed", "the key already holds an object (If-None-Match: *)")
        if isinstance(condition, IfMatch):
            if old is None:
                raise S3Error("NoSuchKey", "no object to match If-Match against")
            if old[0] != bare_etag(condition.etag):
                raise S3Error("PreconditionFailed", "the object's ETag does not match If-Match")
        values = (record.size, bare_etag(record.etag), record.last_modified_ms, encode_meta(record.meta),
                  json.dumps(record.checksums), record.parts_count, encode_manifest(record.manifest))
        if old is not None:  # updated in place: a writer waiting on its lock then reads what this one wrote
            kept = {e.location for e in record.manifest}  # a metadata-only self-copy keeps its blobs
            self.send_to_gc(tx, bucket_id, (e.location for e in decode_manifest(old[1]) if e.location not in kept))
            tx.run("UPDATE objects SET size = ?, etag = ?, mtime_ms = ?, meta = ?, checksums = ?, parts_count = ?, "
                   "manifest = ? WHERE bucket_id = ? AND key = ?", (*values, bucket_id, record.key))
        elif tx.run("INSERT INTO objects (bucket_id, key, size, etag, mtime_ms, meta, checksums, parts_count, "
                    "manifest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (bucket_id, key) DO NOTHING",
                    (bucket_id, record.key, *values)) == 0:
            self.replace_object(tx, bucket_id, record, condition)  # a racing PUT inserted the key first: over it
