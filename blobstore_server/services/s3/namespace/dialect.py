"""What differs between the SQL engines the namespace runs on, and nothing else: one schema, one store.

Statements are written once with `?` placeholders and `{lock}` where a row read before a write must be locked;
a dialect turns them into its engine's text. Types in the schema are written as `{text}`, `{blob}`, `{bigint}`,
and a table's clustering as `{clustered}`. Text and keys compare bytewise on every engine (S3's order).

SQLite lets one writer in at a time, so its writes never race. PostgreSQL (psycopg 3) runs writes side by side in
READ COMMITTED: the `{lock}`ed reads (FOR UPDATE) make the conditional writes safe, a racing insert of the same
key fails on the primary key (ConditionalRequestConflict), a deadlock or a lock waited on too long answers
SlowDown, and a lost connection ServiceUnavailable (the next request opens a new one). Its reads are REPEATABLE
READ, READ ONLY: the probes of one listing page see one snapshot, as a SQLite read transaction does. A statement is
a round trip there, so a delimiter listing's seek per common prefix runs inside one recursive statement (`walk`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

# Every table but users and buckets (small reference tables) is keyed by bucket_id first, so a store that
# distributes by bucket (Citus) or splits ranges of its primary key (CockroachDB, YugabyteDB) can hold them.
# The REFERENCES keep an engine with concurrent writers from landing an object or an upload in a bucket being
# deleted (the insert or the delete fails); SQLite's single writer needs no check and leaves its foreign keys off.
# An intent needs none: one left in a deleted bucket is refused at its commit, or swept, and its blobs go to GC.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS users (name {text} PRIMARY KEY, access_key {text} NOT NULL UNIQUE, "
    "secret {text} NOT NULL, created_ms {bigint} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS buckets (name {text} PRIMARY KEY, id {text} NOT NULL UNIQUE, owner {text} NOT NULL, "
    "created_ms {bigint} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS objects (bucket_id {text} NOT NULL REFERENCES buckets (id), key {blob} NOT NULL, "
    "size {bigint} NOT NULL, etag {text} NOT NULL, mtime_ms {bigint} NOT NULL, meta {text} NOT NULL, "
    "checksums {text} NOT NULL, parts_count INTEGER, manifest {text} NOT NULL, PRIMARY KEY (bucket_id, key))"
    "{clustered}",
    "CREATE TABLE IF NOT EXISTS intents (bucket_id {text} NOT NULL, id {text} NOT NULL, "
    "key {blob} NOT NULL, started_ms {bigint} NOT NULL, PRIMARY KEY (bucket_id, id))",
    "CREATE INDEX IF NOT EXISTS intents_by_age ON intents (started_ms)",
    "CREATE TABLE IF NOT EXISTS intent_extents (bucket_id {text} NOT NULL, intent_id {text} NOT NULL, "
    "location {text} NOT NULL, PRIMARY KEY (bucket_id, intent_id, location))",
    "CREATE TABLE IF NOT EXISTS uploads (bucket_id {text} NOT NULL REFERENCES buckets (id), id {text} NOT NULL, "
    "key {blob} NOT NULL, initiated_ms {bigint} NOT NULL, owner {text} NOT NULL, meta {text} NOT NULL, "
    "PRIMARY KEY (bucket_id, id))",
    "CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (bucket_id, key, id)",
    "CREATE TABLE IF NOT EXISTS parts (bucket_id {text} NOT NULL, upload_id {text} NOT NULL, number INTEGER NOT NULL, "
    "size {bigint} NOT NULL, etag {text} NOT NULL, mtime_ms {bigint} NOT NULL, checksums {text} NOT NULL, "
    "manifest {text} NOT NULL, PRIMARY KEY (bucket_id, upload_id, number))",
    "CREATE TABLE IF NOT EXISTS gc (bucket_id {text} NOT NULL, id {text} NOT NULL, location {text} NOT NULL, "
    "not_before_ms {bigint} NOT NULL, PRIMARY KEY (bucket_id, id))",
    "CREATE INDEX IF NOT EXISTS gc_by_due ON gc (not_before_ms)",
)


@dataclass(frozen=True)
class Dialect:
    """An engine's spelling of the schema and statements, how it starts transactions, and what its errors mean."""

    name: str
    placeholder: str  # what `?` becomes
    types: dict[str, str]  # {text}, {blob}, {bigint}, {clustered} in the schema
    lock: str  # appended to a read that a write in the same transaction depends on
    begin_read: str
    begin_write: str
    s3_code: Callable[[Exception], str | None]  # the S3 error an engine's error is to clients (None: a bug, 500)
    broken: Callable[[Any], bool]  # a connection that can serve no more statements (a new one is opened)
    schema_lock: tuple[str, ...] = ()  # run before the schema: stores starting at once create it one at a time
    walk: WalkObjects | None = None  # where a fetch per common prefix costs a round trip each

    def schema(self) -> list[str]:
        return [*self.schema_lock, *(table.format(**self.types) for table in SCHEMA)]

    def sql(self, statement: str) -> str:
        return _translate(statement, self.placeholder, self.lock)


@lru_cache(maxsize=256)
def _translate(statement: str, placeholder: str, lock: str) -> str:
    return statement.replace("?", placeholder).replace("{lock}", lock)


Connect = Callable[[], Any]  # a new DB-API connection in autocommit mode (transactions begun explicitly)
# walk(bucket_id, lo, hi, n, cut, delimiter, past) -> (statement, params): listing.py's Walk over objects' rows
WalkObjects = Callable[[str, bytes, bytes | None, int, int, bytes, bytes], tuple[str, tuple[Any, ...]]]


def _never_broken(db: Any) -> bool:
    return False


# SQLite: BLOB and TEXT compare with memcmp; WITHOUT ROWID keeps objects clustered on (bucket_id, key) for range
# scans; BEGIN IMMEDIATE takes the write lock up front, so writers queue on busy_timeout instead of failing on
# upgrade. The only engine error clients may see is a writer that waited busy_timeout in vain: SlowDown (503),
# which clients retry.
def _sqlite_s3_code(exc: Exception) -> str | None:
    busy = isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))
    return "SlowDown" if busy else None


SQLITE = Dialect(name="sqlite", placeholder="?", types={"text": "TEXT", "blob": "BLOB", "bigint": "INTEGER",
                                                         "clustered": " WITHOUT ROWID"},
                 lock="", begin_read="BEGIN", begin_write="BEGIN IMMEDIATE", s3_code=_sqlite_s3_code,
                 broken=_never_broken)


def sqlite_connect(path: Path, busy_timeout_ms: int = 30_000) -> Connect:
    """Connections to the SQLite file at `path`: WAL (readers never wait for the writer), synchronous=FULL (a
    committed answer survives a power cut), writers wait up to `busy_timeout_ms` for each other."""

    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    path.parent.mkdir(parents=True, exist_ok=True)
    return connect


# PostgreSQL's SQLSTATEs (or their class, the first two characters) that are a client's to retry, not a bug
_POSTGRES_STATES = {
    "23505": "ConditionalRequestConflict",  # unique_violation: a racing insert of the same key won
    "23503": "ConditionalRequestConflict",  # foreign_key_violation: the bucket was deleted meanwhile, or filled
    "40": "SlowDown",  # transaction_rollback: serialization failure, deadlock
    "55P03": "SlowDown",  # lock_not_available: lock_timeout passed
}


def _postgres_s3_code(exc: Exception) -> str | None:
    import psycopg  # loaded already: only a PostgreSQL connection raises its errors

    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate or ""
    code = _POSTGRES_STATES.get(state) or _POSTGRES_STATES.get(state[:2])
    if code is None and isinstance(exc, psycopg.OperationalError):
        return "ServiceUnavailable"  # the connection was lost, the server is shutting down or full
    return code


def _postgres_broken(db: Any) -> bool:
    return bool(db.closed)


# A skip scan: each step one index seek from the previous row, to its key + NUL or, when the delimiter is in it at
# or after byte `cut`, to the key cut before the delimiter + `past`. 1000 common prefixes in ~20 ms, not 1000 trips.
_POSTGRES_WALK = """WITH RECURSIVE walk (key, size, etag, mtime_ms, n) AS (
  (SELECT key, size, etag, mtime_ms, 1 FROM objects WHERE bucket_id = ? AND key >= ?{upper} ORDER BY key LIMIT 1)
  UNION ALL
  SELECT o.key, o.size, o.etag, o.mtime_ms, w.n + 1 FROM walk w,
    LATERAL (SELECT position(?::bytea IN substring(w.key FROM ?::int + 1)) AS at) p,
    LATERAL (SELECT key, size, etag, mtime_ms FROM objects WHERE bucket_id = ? AND key >= CASE WHEN p.at > 0
             THEN substring(w.key FROM 1 FOR ?::int + p.at - 1) || ?::bytea ELSE w.key || '\\x00'::bytea END{upper}
             ORDER BY key LIMIT 1) o
  WHERE w.n < ?)
SELECT key, size, etag, mtime_ms FROM walk ORDER BY key"""


def _postgres_walk(bucket_id: str, lo: bytes, hi: bytes | None, limit: int, cut: int, delimiter: bytes,
                   past: bytes) -> tuple[str, tuple[Any, ...]]:
    upper, bound = ("", ()) if hi is None else (" AND key < ?", (hi,))
    return (_POSTGRES_WALK.replace("{upper}", upper),
            (bucket_id, lo, *bound, delimiter, cut, bucket_id, cut, past, *bound, limit))


POSTGRESQL = Dialect(name="postgresql", placeholder="%s",
                     types={"text": 'TEXT COLLATE "C"', "blob": "BYTEA", "bigint": "BIGINT", "clustered": ""},
                     lock=" FOR UPDATE", begin_read="BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
                     begin_write="BEGIN", s3_code=_postgres_s3_code, broken=_postgres_broken,
                     schema_lock=("SELECT pg_advisory_xact_lock(4747)",), walk=_postgres_walk)


def postgres_connect(dsn: str, lock_timeout_ms: int = 30_000) -> Connect:
    """Connections (psycopg 3, autocommit) to the database `dsn` names; a write waits up to `lock_timeout_ms` for
    a row another holds, as SQLite's writers wait busy_timeout."""
    import psycopg  # only a gateway on PostgreSQL pays for loading it

    def connect() -> Any:
        db = psycopg.connect(dsn, autocommit=True)
        db.execute(f"SET lock_timeout = {int(lock_timeout_ms)}")
        return db

    return connect


POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def engine(spec: str) -> tuple[Connect, Dialect]:
    """The database a namespace spec names: a `postgresql://` DSN, or else the path of a SQLite file."""
    if spec.startswith(POSTGRES_SCHEMES):
        return postgres_connect(spec), POSTGRESQL
    return sqlite_connect(Path(spec)), SQLITE
