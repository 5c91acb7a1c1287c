"""Undelete: take a DELETE back within the safe delay, as Ambry's undelete does.

A DELETE only queues one message per blob (Kafka `blob_delete`); tinker marks every shard deleted (reads then fail,
and it can be undone), waits out the safe delay and removes the shards for good. Lifting the marks is not enough: a
tinker that lags has not marked yet and would mark and purge later, and one that is purging now removes some shards
before the marks go. So an undelete first leaves a durable record in clustermgr (Raft-replicated, one per Location
slice, through a route of its own: `cancel-delete`), which tinker reads fresh before it marks, after it marked and
before it purges; every delete stamped before the record is taken back. Then it lifts the mark of every shard; a
purge arriving after that is refused by the blobnode, which removes only marked shards. What the shards say then is
the answer (`restore_verdict`):

- every shard present: restored;
- at least the code mode's N data shards of each blob: restored, the others queued for repair;
- fewer for some blob: `Purged` (404), the delay had passed; what it lifted marks from is queued for deletion again;
- too many blobnodes silent to tell: `Unavailable` (503); everything done so far is harmless to repeat.

An object never deleted (or whose delete tinker has not reached yet) is restored with nothing unmarked: the record
takes back any delete of it already queued. clustermgr drops a record `undelete_keep` after the safe delay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from enum import IntEnum

from blobstore.records import UndeleteResult
from blobstore_server.libs.ec import tactic
from blobstore_server.libs.proto.blobnode import NEEDS_REPAIR, ShardState, shard_state
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import UNDELETE_MARGIN, UndeleteSlice
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.proto.mqproxy import DeleteIn, RepairIn
from blobstore_server.libs.rpc.errors import NotFound, Purged, RpcError, Unavailable
from blobstore_server.services.access.objects import ObjectStore
from blobstore_server.services.clustermgr.client import ClusterClient

SHARD_CALLS = 64  # shard calls of one undelete in flight at once
SILENT = frozenset({ShardState.UNREACHABLE, ShardState.ERROR, ShardState.MOVED})  # says nothing about the shard


class Restore(IntEnum):
    """One blob's outcome, in rising order of how bad it is: an object's is its worst blob's."""

    WHOLE = 0
    DEGRADED = 1  # decodes; some shards are gone and get repaired
    UNKNOWN = 2  # too many blobnodes silent to tell
    PURGED = 3  # too few shards left to decode: the delete was carried out


def restore_verdict(states: Sequence[ShardState], data_shards: int) -> Restore:
    """A blob's outcome from its shards' states once their marks were lifted."""
    present = sum(s is ShardState.PRESENT for s in states)
    if present == len(states):
        return Restore.WHOLE
    if present >= data_shards:
        return Restore.DEGRADED
    if present + sum(s in SILENT for s in states) >= data_shards:
        return Restore.UNKNOWN
    return Restore.PURGED


async def undelete(store: ObjectStore, cluster: ClusterClient, location: Location) -> UndeleteResult:
    """Take back every delete of the object issued so far; see the module's docstring for the answers."""
    if not location.blobs:
        return UndeleteResult(blobs=0, unmarked=0, missing=0, unreachable=0)
    await cluster.undelete([UndeleteSlice(vid=s.vid, min_bid=s.min_bid, count=s.count) for s in location.blobs],
                           store.config.delete_safe_delay + store.config.undelete_keep)
    gate = asyncio.Semaphore(SHARD_CALLS)
    blobs = list(location.blob_ids())
    shape = tactic(location.code_mode)
    restored = await asyncio.gather(*(_restore_blob(store, vid, bid, shape.total, gate) for vid, bid in blobs))
    states = [[state for state, _ in shards] for shards in restored]
    data_shards = shape.n
    verdicts = [restore_verdict(s, data_shards) for s in states]
    worst = max(verdicts)
    if worst is Restore.PURGED:
        (vid, bid), shards = next((b, s) for b, s, v in zip(blobs, states, verdicts, strict=True) if v is worst)
        if store.mq is not None and any(ShardState.PRESENT in s for s in states):
            # What it lifted marks from goes again, by deletes stamped past the record's reach.
            await store.mq.send_delete([DeleteIn(vid=v, bid=b, after=2 * UNDELETE_MARGIN) for v, b in blobs])
        raise Purged(f"blob {vid}/{bid} keeps {shards.count(ShardState.PRESENT)} of the {data_shards} shards it "
                     f"needs to decode: the delete was carried out for good, its safe delay "
                     f"({store.config.delete_safe_delay:g} s) having passed")
    if worst is Restore.UNKNOWN:
        raise Unavailable("too many blobnodes did not answer to tell whether the object is whole; its delete is "
                          "taken back all the same: ask again")
    repairs = [RepairIn(vid=vid, bid=bid, bad_indexes=bad, reason="gone before its undelete")
               for (vid, bid), s in zip(blobs, states, strict=True)
               if (bad := [i for i, state in enumerate(s) if state in NEEDS_REPAIR])]
    if repairs and store.mq is not None:
        await store.mq.send_repair(repairs)
    return UndeleteResult(blobs=len(blobs), unmarked=sum(lifted for shards in restored for _, lifted in shards),
                          missing=sum(len(r.bad_indexes) for r in repairs),
                          unreachable=sum(state in SILENT for s in states for state in s))


async def _restore_blob(store: ObjectStore, vid: int, bid: int, shards: int,
                        gate: asyncio.Semaphore) -> list[tuple[ShardState, bool]]:
    """Each of the `shards` shards' state once its mark is lifted, and whether it had one; a volume that is gone
    holds none of them."""
    try:
        volume = await store.volumes.get(vid)
    except NotFound:
        return [(ShardState.MISSING, False)] * shards
    return list(await asyncio.gather(*(_restore_shard(store, vid, index, bid, gate)
                                       for index in range(len(volume.units)))))


async def _restore_shard(store: ObjectStore, vid: int, index: int, bid: int,
                         gate: asyncio.Semaphore) -> tuple[ShardState, bool]:
    blobnodes = store.io.blobnodes

    async def lift(unit: Unit) -> bool:
        info = await blobnodes.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)
        if info.status == "normal":
            return False
        await blobnodes.unmark_delete_shard(unit.host, unit.disk_id, unit.vuid, bid)
        return True

    async with gate:
        try:
            return ShardState.PRESENT, await store.volumes.on_unit(vid, index, lift)
        except RpcError as exc:
            return shard_state(exc), False
