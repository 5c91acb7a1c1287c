"""The S3 gateway's garbage collector: Locations no object refers to any more are deleted through access.

Overwrites, deletes, aborted uploads and given-up PUTs put their Locations in the namespace's GC outbox in the same
transaction that dropped them; here they are deleted through the SDK (access queues the delete pipeline, with its
safe delay) and their rows go once access took them. PUTs that never finished (a gateway killed mid-upload) are
given up after a TTL, their blobs to the outbox. Several gateways may reap one namespace: a Location deleted twice
is harmless, and one already gone counts as done. The store is blocking (SQLite): its calls run in threads.
"""

from __future__ import annotations

import asyncio
import logging

from blobstore import AsyncClient, BlobstoreError, NotFound
from blobstore_server.services.s3.namespace.records import Garbage
from blobstore_server.services.s3.namespace.store import NamespaceStore

log = logging.getLogger(__name__)

DELETES_AT_ONCE = 16  # deletes in flight to access


async def _delete(client: AsyncClient, garbage: Garbage, slots: asyncio.Semaphore) -> bool:
    """Whether the Location is deleted (or was already gone); another failure is logged and tried next round."""
    async with slots:
        try:
            await client.delete(garbage.location)
        except NotFound:
            return True
        except BlobstoreError as exc:
            log.warning("GC of %s (bucket %s) failed, kept for the next round: %s", garbage.location[:24],
                        garbage.bucket_id, exc)
            return False
    return True


async def reap_once(store: NamespaceStore, client: AsyncClient, limit: int = 500) -> int:
    """Delete up to `limit` due Locations of the GC outbox; how many were deleted (their rows are gone)."""
    due = await asyncio.to_thread(store.due_garbage, limit)
    slots = asyncio.Semaphore(DELETES_AT_ONCE)
    deleted = await asyncio.gather(*(_delete(client, garbage, slots) for garbage in due))
    done = [garbage for garbage, ok in zip(due, deleted, strict=True) if ok]
    if done:
        await asyncio.to_thread(store.garbage_done, done)
    return len(done)


async def sweep_intents(store: NamespaceStore, intent_ttl_ms: int) -> int:
    """Give up the PUTs begun more than `intent_ttl_ms` ago (their blobs to the outbox); how many."""
    return await asyncio.to_thread(store.stale_intents, store.clock() - intent_ttl_ms)


async def reap_forever(store: NamespaceStore, client: AsyncClient, interval: float, intent_ttl_ms: int,
                       limit: int = 500) -> None:
    """Sweep stale intents and reap the outbox every `interval` seconds, at once again while batches come full;
    a failed round (the namespace busy, access away) is logged and the next one tries again. Runs until cancelled."""
    while True:
        full = False
        try:
            swept = await sweep_intents(store, intent_ttl_ms)
            if swept:
                log.info("gave up %d PUTs older than %d ms", swept, intent_ttl_ms)
            full = await reap_once(store, client, limit) == limit
        except Exception:
            log.exception("a GC round failed")
        if not full:
            await asyncio.sleep(interval)
