"""What differs between the SQL engines the namespace runs on, and nothing else: one schema, one store.

Statements are written once with `?` placeholders and `{lock}` where a row read before a write must be locked;
a dialect turns them into its engine's text. Types in the schema are written as `{blob}`, `{bigint}`, and a
table's clustering as `{clustered}`. A PostgreSQL backend (psycopg 3) is a Dialect value plus a connect function:
`BYTEA`, `BIGINT`, `%s`, `FOR UPDATE`, no clustering clause, `BEGIN` (READ COMMITTED: the locked reads make the
conditional writes safe; a racing insert of the same key fails on the primary key, which its `s3_code` answers
as ConditionalRequestConflict, and a serialization or lock timeout as SlowDown).
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
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, access_key TEXT NOT NULL UNIQUE, "
    "secret TEXT NOT NULL, created_ms {bigint} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS buckets (name TEXT PRIMARY KEY, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, "
    "created_ms {bigint} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS objects (bucket_id TEXT NOT NULL, key {blob} NOT NULL, size {bigint} NOT NULL, "
    "etag TEXT NOT NULL, mtime_ms {bigint} NOT NULL, meta TEXT NOT NULL, checksums TEXT NOT NULL, "
    "parts_count INTEGER, manifest TEXT NOT NULL, PRIMARY KEY (bucket_id, key)){clustered}",
    "CREATE TABLE IF NOT EXISTS intents (bucket_id TEXT NOT NULL, id TEXT NOT NULL, key {blob} NOT NULL, "
    "started_ms {bigint} NOT NULL, PRIMARY KEY (bucket_id, id))",
    "CREATE INDEX IF NOT EXISTS intents_by_age ON intents (started_ms)",
    "CREATE TABLE IF NOT EXISTS intent_extents (bucket_id TEXT NOT NULL, intent_id TEXT NOT NULL, "
    "location TEXT NOT NULL, PRIMARY KEY (bucket_id, intent_id, location))",
    "CREATE TABLE IF NOT EXISTS uploads (bucket_id TEXT NOT NULL, id TEXT NOT NULL, key {blob} NOT NULL, "
    "initiated_ms {bigint} NOT NULL, owner TEXT NOT NULL, meta TEXT NOT NULL, PRIMARY KEY (bucket_id, id))",
    "CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (bucket_id, key, id)",
    "CREATE TABLE IF NOT EXISTS parts (bucket_id TEXT NOT NULL, upload_id TEXT NOT NULL, number INTEGER NOT NULL, "
    "size {bigint} NOT NULL, etag TEXT NOT NULL, mtime_ms {bigint} NOT NULL, checksums TEXT NOT NULL, "
    "manifest TEXT NOT NULL, PRIMARY KEY (bucket_id, upload_id, number))",
    "CREATE TABLE IF NOT EXISTS gc (bucket_id TEXT NOT NULL, id TEXT NOT NULL, location TEXT NOT NULL, "
    "not_before_ms {bigint} NOT NULL, PRIMARY KEY (bucket_id, id))",
    "CREATE INDEX IF NOT EXISTS gc_by_due ON gc (not_before_ms)",
)


@dataclass(frozen=True)
class Dialect:
    """An engine's spelling of the schema and statements, and how it starts transactions."""

    name: str
    placeholder: str  # what `?` becomes
    types: dict[str, str]  # {blob}, {bigint}, {clustered} in the schema
    lock: str  # appended to a read that a write in the same transaction depends on
    begin_read: str
    begin_write: str
    s3_code: Callable[[Exception], str | None]  # the S3 error an engine's error is to clients (None: a bug, 500)

    def schema(self) -> list[str]:
        return [table.format(**self.types) for table in SCHEMA]

    def sql(self, statement: str) -> str:
        return _translate(statement, self.placeholder, self.lock)


@lru_cache(maxsize=256)
def _translate(statement: str, placeholder: str, lock: str) -> str:
    return statement.replace("?", placeholder).replace("{lock}", lock)


# SQLite: BLOB compares with memcmp; WITHOUT ROWID keeps objects clustered on (bucket_id, key) for range scans;
# BEGIN IMMEDIATE takes the write lock up front, so writers queue on busy_timeout instead of failing on upgrade.
# Writers never race (one holds the write lock at a time), so the only engine error clients may see is a writer
# that waited busy_timeout in vain: SlowDown (503), which clients retry.
def _sqlite_s3_code(exc: Exception) -> str | None:
    busy = isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))
    return "SlowDown" if busy else None


SQLITE = Dialect(name="sqlite", placeholder="?", types={"blob": "BLOB", "bigint": "INTEGER",
                                                         "clustered": " WITHOUT ROWID"},
                 lock="", begin_read="BEGIN", begin_write="BEGIN IMMEDIATE", s3_code=_sqlite_s3_code)

Connect = Callable[[], Any]  # a new DB-API connection in autocommit mode (transactions begun explicitly)


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
