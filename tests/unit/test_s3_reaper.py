"""The reaper's rules on a real SQLite namespace, access stood in for by a client that answers per Location: a
Location already gone counts as deleted, any other failure keeps its outbox row for the next round, stale intents
are swept into the outbox. Deletes through a real cluster are in tests/integration/test_s3_transfer.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from blobstore import AsyncClient, BlobstoreError, Forbidden, NotFound, Unavailable
from blobstore_server.services.s3.namespace import Extent, NamespaceStore, open_sqlite
from blobstore_server.services.s3.reaper import reap_once, sweep_intents


class Access:
    """`delete` as access answers it: the error named for a Location, else success (recorded)."""

    def __init__(self, failures: dict[str, BlobstoreError]) -> None:
        self.failures = failures
        self.deleted: list[str] = []

    async def delete(self, location: str) -> None:
        await asyncio.sleep(0)
        if location in self.failures:
            raise self.failures[location]
        self.deleted.append(location)


def given_up(store: NamespaceStore, key: bytes, locations: list[str]) -> None:
    intent = store.begin_intent(store.get_bucket("bucket"), key)
    for location in locations:
        store.add_intent_extent(intent, Extent(0, 1, location))
    store.abandon_intent(intent)


def test_gone_counts_as_deleted_and_other_failures_wait_for_the_next_round(tmp_path: Path) -> None:
    store = open_sqlite(tmp_path / "ns.sqlite", gc_delay_ms=0)
    store.create_bucket("bucket", "alice")
    given_up(store, b"k", ["ok1", "gone", "busy", "forged", "ok2"])
    access = Access({"gone": NotFound("no such blob"), "busy": Unavailable("no access host"),
                     "forged": Forbidden("bad signature")})
    client = cast(AsyncClient, access)

    assert asyncio.run(reap_once(store, client)) == 3
    assert sorted(access.deleted) == ["ok1", "ok2"]
    assert sorted(g.location for g in store.due_garbage(100)) == ["busy", "forged"]

    del access.failures["busy"]
    assert asyncio.run(reap_once(store, client)) == 1
    assert [g.location for g in store.due_garbage(100)] == ["forged"]


def test_a_batch_takes_at_most_limit_rows_and_none_before_their_delay(tmp_path: Path) -> None:
    now = [1_000_000]
    store = open_sqlite(tmp_path / "ns.sqlite", gc_delay_ms=60_000, clock=lambda: now[0])
    store.create_bucket("bucket", "alice")
    given_up(store, b"k", [f"loc{i}" for i in range(7)])
    access = Access({})
    client = cast(AsyncClient, access)

    assert asyncio.run(reap_once(store, client)) == 0, "the outbox keeps Locations until the delay has passed"
    now[0] += 60_000
    assert asyncio.run(reap_once(store, client, limit=5)) == 5
    assert asyncio.run(reap_once(store, client, limit=5)) == 2
    assert sorted(access.deleted) == [f"loc{i}" for i in range(7)]


def test_intents_older_than_the_ttl_are_swept_into_the_outbox(tmp_path: Path) -> None:
    now = [1_000_000]
    store = open_sqlite(tmp_path / "ns.sqlite", gc_delay_ms=0, clock=lambda: now[0])
    store.create_bucket("bucket", "alice")
    old = store.begin_intent(store.get_bucket("bucket"), b"old")
    store.add_intent_extent(old, Extent(0, 1, "old-blob"))
    now[0] += 10_000
    young = store.begin_intent(store.get_bucket("bucket"), b"young")
    store.add_intent_extent(young, Extent(0, 1, "young-blob"))
    now[0] += 1_000

    assert asyncio.run(sweep_intents(store, 5_000)) == 1
    assert [g.location for g in store.due_garbage(100)] == ["old-blob"]
