"""What the gateway does with each blob a PUT stored when the namespace fails to record it."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from blobstore import AsyncClient
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.config import S3Config
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace import SQLITE, Extent, NamespaceStore, sqlite_connect


def test_a_blob_the_namespace_could_not_record_goes_to_gc_when_the_put_is_abandoned(tmp_path: Path) -> None:
    path = tmp_path / "namespace.db"
    store = NamespaceStore(sqlite_connect(path, busy_timeout_ms=50), SQLITE, gc_delay_ms=0)
    bucket = store.create_bucket("photos", "alice")
    intent = store.begin_intent(bucket, b"k")
    blocker = sqlite3.connect(path, isolation_level=None)  # another writer holds the lock past busy_timeout

    async def store_one() -> None:
        async with AsyncClient("http://127.0.0.1:1") as unused:
            backend = Backend(store, unused, S3Config(access_hosts=["http://127.0.0.1:1"]))
            await backend.stored_into(intent)(Extent(0, 10, "loc-1"), False)

    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(S3Error, match=r"^SlowDown"):
            asyncio.run(store_one())
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    store.abandon_intent(intent)
    assert [g.location for g in store.due_garbage(10)] == ["loc-1"]
    store.close()
