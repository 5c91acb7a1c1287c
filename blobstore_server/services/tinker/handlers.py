"""What tinker does with one message. Every step is idempotent: a message seen twice harms nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from blobstore_server.libs.ec import tactic
from blobstore_server.libs.proto.blobnode import IOClass, ShardInfo, ShardState, ShardStatusResult, shard_state
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.messages import DeleteMsg, RepairMsg
from blobstore_server.libs.rpc.errors import NotFound, ShardNotFound, Unavailable
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient, VolumeCache
from blobstore_server.services.tinker.rules import UploadVerdict, upload_verdict
from blobstore_server.services.worker.client import WorkerClient

UNITS_TTL = 30.0  # deletes come in runs over the same volumes
ShardOp = Callable[[str, int, int, int, IOClass], Awaitable[ShardStatusResult]]


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
    shards for good only once the safe delay after the DELETE has passed."""

    def __init__(self, cluster: ClusterClient, blobnodes: BlobnodeClient, delete_log: Path) -> None:
        self.volumes = VolumeCache(cluster, UNITS_TTL)
        self.blobnodes = blobnodes
        self.delete_log = delete_log

    async def _on_every_shard(self, op: ShardOp, vid: int, bid: int) -> None:
        """Apply `op` to the blob's shard on every unit (refetching the volume if a unit moved)."""
        try:
            await self.volumes.get(vid)
        except NotFound:
            return  # no such volume: nothing to delete
        await self.volumes.on_units(vid, lambda unit: self._each(op, unit, bid))

    async def mark(self, msg: DeleteMsg) -> None:
        for vid, bid in msg.blob_ids():
            await self._on_every_shard(self.blobnodes.mark_delete_shard, vid, bid)

    async def purge(self, msg: DeleteMsg) -> None:
        for vid, bid in msg.blob_ids():
            await self._on_every_shard(self.blobnodes.delete_shard, vid, bid)
            entry = {"vid": vid, "bid": bid, "deleted_at": msg.time, "purged_at": time.time()}
            with self.delete_log.open("a") as log:
                log.write(json.dumps(entry) + "\n")

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
