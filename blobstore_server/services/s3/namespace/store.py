"""The namespace store: users, buckets, objects, listings and the GC outbox, over any DB-API engine (dialect.py).

Each method is one transaction, committed before it returns: what a request wrote, the next request (through any
store object on the same database) reads and lists. Every statement on bucket data names its bucket_id; only the
background sweeps (`due_garbage`, `stale_intents`) read across buckets, needing no snapshot.

A PUT: `begin_intent` (in memory), then `add_intent_extent` after each blob but a short last one is written (the
first writes the intent's row; a crashed gateway's blobs are found by `stale_intents`), then `commit_object`, which
records the last blob in its own transaction (a small object is one write), or `abandon_intent` if the PUT fails.
A commit that is refused (a condition, a deleted bucket) sends the PUT's blobs to GC itself.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable, Sequence
from pathlib import Path

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace.base import (
    Row,
    Tx,
    check_key,
    decode_manifest,
    decode_meta,
    new_id,
    wall_ms,
)
from blobstore_server.services.s3.namespace.dialect import engine
from blobstore_server.services.s3.namespace.listing import Query, Source, list_page
from blobstore_server.services.s3.namespace.naming import valid_bucket_name
from blobstore_server.services.s3.namespace.records import (
    Bucket,
    Condition,
    Credentials,
    Extent,
    Garbage,
    Intent,
    ListedObject,
    ObjectRecord,
    ObjectsPage,
    User,
)
from blobstore_server.services.s3.namespace.uploads import Uploads

MAX_DELETE_KEYS = 1000
_KEY_ID_ALPHABET = string.ascii_uppercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits + "+/"


class UserExists(ValueError):
    """A user of that name exists already."""


class NoSuchUser(LookupError):
    """No user of that name."""


class NamespaceStore(Uploads):
    """The namespace (multipart operations in uploads.py). Safe to share between threads: see base.py."""

    # users -----------------------------------------------------------------------------------------------------

    def add_user(self, name: str) -> tuple[str, str]:
        """A new user: its access key id (20 characters, as AWS's) and secret (40), shown once."""
        access_key = "AK" + "".join(secrets.choice(_KEY_ID_ALPHABET) for _ in range(18))
        secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(40))
        with self.transaction(write=True) as tx:
            if tx.one("SELECT 1 FROM users WHERE name = ?", (name,)) is not None:
                raise UserExists(name)
            tx.run("INSERT INTO users (name, access_key, secret, created_ms) VALUES (?, ?, ?, ?)",
                   (name, access_key, secret, self.clock()))
        return access_key, secret

    def ensure_user(self, name: str, access_key: str, secret: str, buckets: Sequence[str] = ()) -> None:
        """The user `name` signing with these keys, owning `buckets`, whether or not they existed: a service user
        whose keys the cluster's secret derives, set up by every gateway at its start."""
        with self.transaction(write=True) as tx:
            tx.run("INSERT INTO users (name, access_key, secret, created_ms) VALUES (?, ?, ?, ?) ON CONFLICT (name) "
                   "DO UPDATE SET access_key = excluded.access_key, secret = excluded.secret",
                   (name, access_key, secret, self.clock()))
        for bucket in buckets:
            for attempt in range(2):  # a racing gateway's insert of the same bucket (PostgreSQL) wins first
                try:
                    self.create_bucket(bucket, name)
                except S3Error as exc:
                    if exc.code == "BucketAlreadyOwnedByYou":
                        break
                    if exc.code != "ConditionalRequestConflict" or attempt:
                        raise
                else:
                    break

    def list_users(self) -> list[User]:
        with self.transaction(write=False) as tx:
            rows = tx.all("SELECT name, access_key, created_ms FROM users ORDER BY name")
        return [User(name, access_key, created_ms) for name, access_key, created_ms in rows]

    def remove_user(self, name: str) -> None:
        """Remove a user (its buckets stay, owned by the name; a user added again under it owns them)."""
        with self.transaction(write=True) as tx:
            if tx.run("DELETE FROM users WHERE name = ?", (name,)) == 0:
                raise NoSuchUser(name)

    def credentials(self, access_key: str) -> Credentials | None:
        """Who signs with `access_key` (the owner of the buckets it creates) and the secret it signs with."""
        with self.transaction(write=False) as tx:
            row = tx.one("SELECT name, access_key, created_ms, secret FROM users WHERE access_key = ?", (access_key,))
        return None if row is None else Credentials(User(*row[:3]), str(row[3]))

    # buckets ---------------------------------------------------------------------------------------------------

    def create_bucket(self, name: str, owner: str) -> Bucket:
        if not valid_bucket_name(name):
            raise S3Error("InvalidBucketName", "the bucket name breaks S3's naming rules", name)
        with self.transaction(write=True) as tx:
            row = tx.one("SELECT owner FROM buckets WHERE name = ?{lock}", (name,))
            if row is not None and row[0] == owner:
                raise S3Error("BucketAlreadyOwnedByYou", "you own this bucket already", name)
            if row is not None:
                raise S3Error("BucketAlreadyExists", "the bucket name is taken", name)
            now = self.clock()
            bucket = Bucket(new_id(now), name, owner, now)
            tx.run("INSERT INTO buckets (name, id, owner, created_ms) VALUES (?, ?, ?, ?)",
                   (name, bucket.id, owner, now))
        return bucket

    def get_bucket(self, name: str) -> Bucket:
        with self.transaction(write=False) as tx:
            return self._bucket(tx, name)

    def _bucket(self, tx: Tx, name: str) -> Bucket:
        row = tx.one("SELECT id, name, owner, created_ms FROM buckets WHERE name = ?", (name,))
        if row is None:
            raise S3Error("NoSuchBucket", "the bucket does not exist", name)
        return Bucket(*row)

    def list_buckets(self, owner: str) -> list[Bucket]:
        with self.transaction(write=False) as tx:
            rows = tx.all("SELECT id, name, owner, created_ms FROM buckets WHERE owner = ? ORDER BY name", (owner,))
        return [Bucket(*row) for row in rows]

    def delete_bucket(self, name: str) -> None:
        """Delete an empty bucket; its multipart uploads and PUTs in flight are given up, their blobs to GC."""
        with self.transaction(write=True) as tx:
            bucket_id = self.bucket_id(tx, name)
            if tx.one("SELECT 1 FROM objects WHERE bucket_id = ? LIMIT 1", (bucket_id,)) is not None:
                raise S3Error("BucketNotEmpty", "the bucket holds objects", name)
            for (upload_id,) in tx.all("SELECT id FROM uploads WHERE bucket_id = ?{lock}", (bucket_id,)):
                self.drop_upload(tx, bucket_id, upload_id)
            for (intent_id,) in tx.all("SELECT id FROM intents WHERE bucket_id = ?", (bucket_id,)):
                self.drop_intent(tx, bucket_id, intent_id, to_gc=True)
            tx.run("DELETE FROM buckets WHERE name = ?", (name,))

    # objects ---------------------------------------------------------------------------------------------------

    def begin_intent(self, bucket: Bucket, key: bytes) -> Intent:
        """A PUT about to write blobs for `key` (nothing is written until its first blob is recorded)."""
        check_key(key)
        return Intent(bucket.id, new_id(self.clock()), key)

    def add_intent_extent(self, intent: Intent, extent: Extent) -> None:
        """Record a blob the PUT wrote (call it once the blob is written, before going on); the first writes the
        intent's row."""
        with self.transaction(write=True) as tx:
            if not intent.opened:
                tx.run("INSERT INTO intents (bucket_id, id, key, started_ms) VALUES (?, ?, ?, ?)",
                       (intent.bucket_id, intent.id, intent.key, self.clock()))
                given_up = False
            else:
                given_up = tx.one("SELECT 1 FROM intents WHERE bucket_id = ? AND id = ?{lock}",
                                  (intent.bucket_id, intent.id)) is None
            if given_up:  # the blob goes straight to GC, committed before the PUT learns it failed
                self.send_to_gc(tx, intent.bucket_id, [extent.location])
            else:
                tx.run("INSERT INTO intent_extents (bucket_id, intent_id, location) VALUES (?, ?, ?) "
                       "ON CONFLICT (bucket_id, intent_id, location) DO NOTHING",
                       (intent.bucket_id, intent.id, extent.location))
        intent.opened = True
        if given_up:
            raise S3Error("InternalError", "the upload took too long and was given up; send it again")

    def commit_object(self, bucket: str, record: ObjectRecord, intent: Intent | None,
                      condition: Condition = None) -> None:
        """Make `record` the object at its key, if `condition` holds: one transaction checks it, replaces the old
        object (its blobs to GC) and closes the intent (None: an object with no blobs, or a metadata-only copy).
        Refused, the PUT's blobs go to GC in that transaction and the error is raised."""
        self.settle_intent(bucket, intent,
                           lambda tx, bucket_id: self.replace_object(tx, bucket_id, record, condition))

    def abandon_intent(self, intent: Intent) -> None:
        """Give up a PUT: its blobs go to GC (no error if it is gone already; no write if it holds none)."""
        if not intent.opened and not intent.pending:
            return
        with self.transaction(write=True) as tx:
            self.give_up(tx, intent)
        intent.opened, intent.pending = False, []

    def get_object(self, bucket: str, key: bytes) -> ObjectRecord:
        with self.transaction(write=False) as tx:
            bucket_id = self.bucket_id(tx, bucket)
            row = tx.one("SELECT key, size, etag, mtime_ms, meta, checksums, parts_count, manifest FROM objects "
                         "WHERE bucket_id = ? AND key = ?", (bucket_id, key))
        if row is None:
            raise S3Error("NoSuchKey", "the key holds no object")
        key, size, etag, mtime_ms, meta, checksums, parts_count, manifest = row
        return ObjectRecord(bytes(key), size, etag, mtime_ms, decode_meta(meta), json.loads(checksums), parts_count,
                            decode_manifest(manifest))

    def delete_object(self, bucket: str, key: bytes) -> bool:
        """Delete an object (its blobs to GC); False if the key held none (S3 answers 204 all the same)."""
        with self.transaction(write=True) as tx:
            return self._delete(tx, self.bucket_id(tx, bucket), key)

    def delete_objects(self, bucket: str, keys: Sequence[bytes]) -> list[bytes]:
        """DeleteObjects: up to 1000 keys in one transaction; the keys that held an object."""
        if len(keys) > MAX_DELETE_KEYS:
            raise S3Error("MalformedXML", f"at most {MAX_DELETE_KEYS} keys in one request", bucket)
        with self.transaction(write=True) as tx:
            bucket_id = self.bucket_id(tx, bucket)
            return [key for key in keys if self._delete(tx, bucket_id, key)]

    def _delete(self, tx: Tx, bucket_id: str, key: bytes) -> bool:
        row = tx.one("SELECT manifest FROM objects WHERE bucket_id = ? AND key = ?{lock}", (bucket_id, key))
        if row is None:
            return False
        self.send_to_gc(tx, bucket_id, (e.location for e in decode_manifest(row[0])))
        tx.run("DELETE FROM objects WHERE bucket_id = ? AND key = ?", (bucket_id, key))
        return True

    # listing ---------------------------------------------------------------------------------------------------

    def list_objects(self, bucket: str, prefix: bytes = b"", delimiter: bytes = b"", after: bytes | None = None,
                     max_keys: int = 1000) -> ObjectsPage:
        """A page of ListObjects (v1 `marker`, v2 `start-after` or the decoded continuation token as `after`)."""
        with self.transaction(write=False) as tx:
            bucket_id = self.bucket_id(tx, bucket)

            def fetch(lo: bytes, past: bytes | None, hi: bytes | None, limit: int) -> list[Row]:
                lo = lo if past is None else max(lo, past + b"\x00")
                if hi is None:
                    return tx.all(f"{_LIST} ORDER BY key LIMIT ?", (bucket_id, lo, limit))
                return tx.all(f"{_LIST} AND key < ? ORDER BY key LIMIT ?", (bucket_id, lo, hi, limit))

            steps = self.dialect.walk  # the seeks past each common prefix in one statement, where it has one
            walk = None if steps is None else lambda *args: tx.all(*steps(bucket_id, *args))
            page = list_page(Source(fetch, key=_row_key, position=_row_key, walk=walk),
                             Query(prefix, delimiter, after, None, max_keys))
        last = page.last  # rows become records only once in the page: a probe past a common prefix stays cheap
        return ObjectsPage([ListedObject(bytes(key), size, etag, mtime) for key, size, etag, mtime in page.entries],
                           page.prefixes, page.truncated, bytes(last[0]) if isinstance(last, tuple) else last)

    # garbage ---------------------------------------------------------------------------------------------------

    def due_garbage(self, limit: int, now_ms: int | None = None) -> list[Garbage]:
        """Outbox rows whose delay has passed, oldest first (a sweep across buckets)."""
        now = self.clock() if now_ms is None else now_ms
        with self.transaction(write=False) as tx:
            rows = tx.all("SELECT bucket_id, id, location FROM gc WHERE not_before_ms <= ? "
                          "ORDER BY not_before_ms LIMIT ?", (now, limit))
        return [Garbage(*row) for row in rows]

    def garbage_done(self, done: Sequence[Garbage]) -> None:
        """Blobs deleted through access: their outbox rows go."""
        with self.transaction(write=True) as tx:
            tx.many("DELETE FROM gc WHERE bucket_id = ? AND id = ?", [(g.bucket_id, g.id) for g in done])

    def stale_intents(self, older_than_ms: int) -> int:
        """Give up PUTs begun before `older_than_ms` (a crashed or stuck gateway's): their blobs go to GC. How many."""
        with self.transaction(write=True) as tx:
            stale = tx.all("SELECT bucket_id, id FROM intents WHERE started_ms < ?", (older_than_ms,))
            for bucket_id, intent_id in stale:
                self.drop_intent(tx, bucket_id, intent_id, to_gc=True)
        return len(stale)


_LIST = "SELECT key, size, etag, mtime_ms FROM objects WHERE bucket_id = ? AND key >= ?"


def _row_key(row: Row) -> bytes:
    return bytes(row[0])


def open_sqlite(path: Path, gc_delay_ms: int = 60_000, clock: Callable[[], int] = wall_ms) -> NamespaceStore:
    """The namespace in the SQLite file at `path` (created if missing)."""
    return open_namespace(str(path), gc_delay_ms, clock)


def open_namespace(spec: str, gc_delay_ms: int = 60_000, clock: Callable[[], int] = wall_ms) -> NamespaceStore:
    """The namespace `spec` names: a `postgresql://` DSN (PostgreSQL), or the path of a SQLite file (created if
    missing). The gateway's `namespace` config and the CLI's --namespace take either."""
    connect, dialect = engine(spec)
    return NamespaceStore(connect, dialect, gc_delay_ms=gc_delay_ms, clock=clock)
