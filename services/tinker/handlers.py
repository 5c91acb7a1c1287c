"""What tinker does with one message. Every step is idempotent: a message seen twice harms nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from libs.proto.cluster import Unit
from libs.proto.messages import DeleteMsg, RepairMsg
from libs.rpc.errors import ChunkNotFound, NotFound, ShardNotFound, StaleEpoch, Unavailable
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from services.worker.client import WorkerClient

UNITS_TTL = 30.0


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
        self.cluster = cluster
        self.blobnodes = blobnodes
        self.delete_log = delete_log
        self._units: dict[int, tuple[float, list[Unit]]] = {}  # vid -> (expiry, units): deletes come in runs

    async def _volume_units(self, vid: int, fresh: bool) -> list[Unit]:
        cached = self._units.get(vid)
        if not fresh and cached is not None and cached[0] > time.monotonic():
            return cached[1]
        try:
            units = (await self.cluster.get_volume(vid)).units
        except NotFound:
            units = []  # no such volume: nothing to delete
        self._units[vid] = (time.monotonic() + UNITS_TTL, units)
        return units

    async def _on_every_shard(self, op: Callable[..., Awaitable[object]], msg: DeleteMsg) -> None:
        """Apply `op` to the blob's shard on every unit; a unit that moved meanwhile (stale epoch, no
        chunk) makes one more pass with the volume fetched fresh."""
        for fresh in (False, True):
            units = await self._volume_units(msg.vid, fresh)
            try:
                await asyncio.gather(*(self._each(op, u, msg.bid) for u in units))
                return
            except (StaleEpoch, ChunkNotFound):
                if fresh:
                    raise

    async def mark(self, msg: DeleteMsg) -> None:
        await self._on_every_shard(self.blobnodes.mark_delete_shard, msg)

    async def purge(self, msg: DeleteMsg) -> None:
        await self._on_every_shard(self.blobnodes.delete_shard, msg)
        entry = {"vid": msg.vid, "bid": msg.bid, "deleted_at": msg.time, "purged_at": time.time()}
        with self.delete_log.open("a") as log:
            log.write(json.dumps(entry) + "\n")

    @staticmethod
    async def _each(op: Callable[..., Awaitable[object]], unit: Unit, bid: int) -> None:
        with contextlib.suppress(ShardNotFound):  # never written there, or already gone
            await op(unit.host, unit.disk_id, unit.vuid, bid)
