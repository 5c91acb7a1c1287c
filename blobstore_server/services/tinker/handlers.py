"""What tinker does with one message. Every step is idempotent: a message seen twice harms nothing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from blobstore_server.libs.ec import tactic
from blobstore_server.libs.proto.blobnode import IOClass, ShardInfo, ShardState, ShardStatusResult, shard_state
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import MAX_UNDELETE_LOOKS
from blobstore_server.libs.proto.messages import DeleteIntent, DeleteMsg, RepairMsg
from blobstore_server.libs.rpc.coalesce import Coalescer
from blobstore_server.libs.rpc.errors import NotFound, RpcError, ShardNotFound, Unavailable
from blobstore_server.libs.rpc.tickets import Minter
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient, VolumeCache
from blobstore_server.services.tinker.rules import UploadVerdict, taken_back, upload_verdict
from blobstore_server.services.worker.client import WorkerClient

log = logging.getLogger(__name__)
UNITS_TTL = 30.0  # deletes come in runs over the same volumes
ShardOp = Callable[[str, int, int, int, IOClass], Awaitable[ShardStatusResult]]
Blob = tuple[int, int]  # vid, bid
CLUSTERMGR = "clustermgr"  # the one peer undelete looks go to (its client follows the leader)


class RepairHandler:
    def __init__(self, cluster: ClusterClient, workers: WorkerClient) -> None:
        self.cluster = cluster
        self.workers = workers

    async def __call__(self, msg: RepairMsg) -> None:
        """Ask a live worker to rebuild the shards; any failure raises (the message is retried)."""
        workers = await self.cluster.list_services("worker")
        if not workers:
            raise Unavailable("no worker is registered")
        await self.workers.repair_shards(random.choice(workers).host, msg.vid, msg.bid, msg.bad_indexes)


class DeleteHandler:
    """Mark-delete every shard at once (reads then fail, and it can still be undone), and remove the
    shards for good only once the safe delay after the DELETE has passed. An undelete takes the delete back: its
    record in clustermgr is read fresh before marking, after marking and before purging, and a blob it covers is
    left as it was, its marks lifted (services/access/undelete.py)."""

    def __init__(self, cluster: ClusterClient, blobnodes: BlobnodeClient, delete_log: Path,
                 tickets: Minter | None = None) -> None:
        self.cluster = cluster
        self.volumes = VolumeCache(cluster, UNITS_TTL)
        self.blobnodes = blobnodes
        self.tickets = tickets  # of delete tickets (libs/rpc/tickets.py); None without auth
        self.delete_log = delete_log
        # Each look is a fresh (read-index) read on clustermgr's leader, three per deleted blob: those asked while one
        # is on its way go together in the next (0.65-0.85 ms of leader CPU a request, measured on a loaded machine).
        self._looks: Coalescer[Blob, float | None] = Coalescer(
            self._look_one, self._look_many, size=lambda _: 1, in_flight=1, max_items=MAX_UNDELETE_LOOKS,
            max_bytes=MAX_UNDELETE_LOOKS)

    async def _look_one(self, _: str, blob: Blob) -> float | None:
        return (await self.cluster.undeleted([blob]))[0]

    async def _look_many(self, _: str, blobs: list[Blob]) -> list[float | BaseException | None]:
        return [*await self.cluster.undeleted(blobs)]

    async def _on_every_shard(self, op: ShardOp, vid: int, bid: int) -> None:
        """Apply `op` to the blob's shard on every unit (refetching the volume if a unit moved)."""
        try:
            await self.volumes.get(vid)
        except NotFound:
            return  # no such volume: nothing to delete
        await self.volumes.on_units(vid, lambda unit: self._each(op, unit, bid))

    async def _standing(self, msg: DeleteMsg, blobs: Iterable[Blob]) -> list[Blob]:
        """The blobs whose delete no undelete took back; those it did have their marks lifted (a failure raises: the
        message is retried, and taken back again then, until every mark is gone)."""
        blobs = list(blobs)
        looks = await asyncio.gather(*(self._looks.call(CLUSTERMGR, blob) for blob in blobs))
        standing: list[Blob] = []
        for (vid, bid), undeleted_at in zip(blobs, looks, strict=True):
            if not taken_back(msg.time, undeleted_at):
                standing.append((vid, bid))
            else:
                await self._on_every_shard(self.blobnodes.unmark_delete_shard, vid, bid)
        return standing

    async def mark(self, msg: DeleteMsg) -> list[Blob]:
        """Mark every shard of the blobs no undelete took back; the blobs marked. An undelete that lands meanwhile
        is found by the look after marking, and its marks are lifted at once."""
        blobs = await self._standing(msg, msg.blob_ids())
        mark = functools.partial(self._mark, intent=msg.signed_intent())
        for vid, bid in blobs:
            await self._on_every_shard(mark, vid, bid)
        return await self._standing(msg, blobs)

    async def purge(self, msg: DeleteMsg, blobs: list[Blob]) -> list[Blob]:
        """Remove for good every shard of the marked `blobs` no undelete took back since; the blobs purged. A
        blobnode refuses to remove a shard whose mark was lifted: an undelete that landed after the look, found by
        the look after the refusal (without one the refusal stands, and the message is retried)."""
        purged, delete = [], functools.partial(self._delete, intent=msg.signed_intent())
        for vid, bid in await self._standing(msg, blobs):
            try:
                await self._on_every_shard(delete, vid, bid)
            except RpcError:
                if await self._standing(msg, [(vid, bid)]):
                    raise
                log.info("blob %d/%d was undeleted while it was being purged: left as it was", vid, bid)
                continue
            entry = {"vid": vid, "bid": bid, "deleted_at": msg.time, "purged_at": time.time()}
            with self.delete_log.open("a") as delete_log:
                delete_log.write(json.dumps(entry) + "\n")
            purged.append((vid, bid))
        return purged

    def _ticket(self, host: str, disk_id: int, vuid: int, bid: int) -> str | None:
        """Tinker's delete ticket for the shard: it marks only a blob whose delete stands and deletes it for good
        only past the safe delay, and only tinker's key mints one (the blobnode still checks the mark's hold, and
        access's intent, which the message carries, for the blob)."""
        return None if self.tickets is None else self.tickets.mint(host, disk_id, vuid, bid)

    async def _mark(self, host: str, disk_id: int, vuid: int, bid: int, io_class: IOClass, *,
                    intent: DeleteIntent | None) -> ShardStatusResult:
        ticket = self._ticket(host, disk_id, vuid, bid)
        return await self.blobnodes.mark_delete_shard(host, disk_id, vuid, bid, io_class, ticket=ticket, intent=intent)

    async def _delete(self, host: str, disk_id: int, vuid: int, bid: int, io_class: IOClass, *,
                      intent: DeleteIntent | None) -> ShardStatusResult:
        ticket = self._ticket(host, disk_id, vuid, bid)
        return await self.blobnodes.delete_shard(host, disk_id, vuid, bid, io_class, ticket=ticket, intent=intent)

    async def upload_finished(self, msg: DeleteMsg) -> bool:
        """Whether every blob of a multipart upload was written (then its reclaim does nothing); raises
        Unavailable while too many blobnodes are silent to tell."""
        blobs, data_shards = [], 0
        for vid, bid in msg.blob_ids():
            try:
                volume = await self.volumes.get(vid)
            except NotFound:
                return False  # the volume is gone: nothing of the upload can be read
            outcomes = await asyncio.gather(*(self.blobnodes.shard_stat(u.host, u.disk_id, u.vuid, bid,
                                                                         IOClass.BACKGROUND)
                                              for u in volume.units), return_exceptions=True)
            blobs.append([_stat_state(o) for o in outcomes])
            data_shards = tactic(volume.code_mode).n
        verdict = upload_verdict(blobs, data_shards)
        if verdict is UploadVerdict.UNKNOWN:
            raise Unavailable(f"upload from blob {msg.vid}/{msg.bid}: too many blobnodes silent to tell if it finished")
        return verdict is UploadVerdict.FINISHED

    @staticmethod
    async def _each(op: ShardOp, unit: Unit, bid: int) -> None:
        with contextlib.suppress(ShardNotFound):  # never written there, or already gone
            await op(unit.host, unit.disk_id, unit.vuid, bid, IOClass.BACKGROUND)  # capped: users go first


def _stat_state(outcome: ShardInfo | BaseException) -> ShardState:
    if isinstance(outcome, ShardInfo) and outcome.status != "normal":
        return ShardState.DELETED
    return shard_state(outcome)
