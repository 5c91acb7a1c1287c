"""What tinker does with one message. Every step is idempotent: a message seen twice harms nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from pathlib import Path

from libs.proto.cluster import Unit
from libs.proto.messages import DeleteMsg, RepairMsg
from libs.rpc.errors import NotFound, Unavailable
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from services.worker.client import WorkerClient


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

    async def _units(self, msg: DeleteMsg) -> list[Unit]:
        try:
            return (await self.cluster.get_volume(msg.vid)).units
        except NotFound:
            return []  # no such volume: nothing to delete

    async def mark(self, msg: DeleteMsg) -> None:
        units = await self._units(msg)
        await asyncio.gather(*(self._each(self.blobnodes.mark_delete_shard, u, msg.bid) for u in units))

    async def purge(self, msg: DeleteMsg) -> None:
        units = await self._units(msg)
        await asyncio.gather(*(self._each(self.blobnodes.delete_shard, u, msg.bid) for u in units))
        entry = {"vid": msg.vid, "bid": msg.bid, "deleted_at": msg.time, "purged_at": time.time()}
        with self.delete_log.open("a") as log:
            log.write(json.dumps(entry) + "\n")

    @staticmethod
    async def _each(op: object, unit: Unit, bid: int) -> None:
        with contextlib.suppress(NotFound):  # never written there, or already gone
            await op(unit.host, unit.disk_id, unit.vuid, bid)  # type: ignore[operator]
