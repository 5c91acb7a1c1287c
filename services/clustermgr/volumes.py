"""Volume creation on the leader: keep enough allocatable volumes of every enabled code mode.

A volume is created in three steps, each durable before the next: (1) an intent naming the vid
and its chosen units is committed to the kv, (2) the chunks are created on the blobnodes,
(3) the volume is committed and the intent removed in order. If a step fails, or the leader dies
between steps, the intent is rolled back: every chunk it names is released, and only once every
blobnode has confirmed is the intent removed. The leader retries leftover intents every round,
so a chunk on a node that was down is released when it returns: no half-created volume stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from libs.ec import CodeMode, tactic
from libs.proto.cluster import DiskInfo, VolumeStatus
from libs.proto.ids import Vuid
from libs.rpc.errors import NotFound, RpcError
from services.blobnode.client import BlobnodeClient
from services.clustermgr.placement import Candidate, PlacementError, place_volume
from services.clustermgr.state import ClusterState

log = logging.getLogger(__name__)
INTENT_PREFIX = "volume_intent/"
Propose = Callable[..., Awaitable[Any]]


def as_candidate(disk: DiskInfo) -> Candidate:
    return Candidate(disk.disk_id, disk.host, disk.idc, disk.rack, disk.free)


def candidates(disks: list[DiskInfo], now: float, heartbeat_timeout: float) -> list[Candidate]:
    """Disks that may take a new chunk: writable and heard from recently."""
    return [as_candidate(d) for d in disks if d.writable and now - d.last_heartbeat <= heartbeat_timeout]


def allocatable_count(state: ClusterState, mode: CodeMode) -> int:
    return sum(1 for v in state.volumes()
               if v.code_mode == mode and v.status is not VolumeStatus.LOCK and v.free > 0)


class VolumeCreator:
    def __init__(self, state: ClusterState, propose: Propose, blobnodes: BlobnodeClient, *,
                 idcs: list[str], backend: str, chunk_size: int, heartbeat_timeout: float) -> None:
        self.state = state
        self.propose = propose
        self.blobnodes = blobnodes
        self.idcs = idcs
        self.backend = backend
        self.chunk_size = chunk_size
        self.heartbeat_timeout = heartbeat_timeout
        self.rng = random.Random()

    async def create(self, mode: CodeMode, now: float) -> int:
        """Create one volume of `mode`; returns its vid. Raises on failure after rolling back."""
        t = tactic(mode)
        pool = candidates(list(self.state.disks()), now, self.heartbeat_timeout)
        idcs = [idc for idc in self.idcs if any(c.idc == idc for c in pool)] if t.az_count > 1 else None
        placed = place_volume(t, pool, idcs=idcs, rng=self.rng)
        vid = (await self.propose("scope_alloc", name="vid", count=1))["start"]
        units = [{"vuid": int(Vuid.make(vid, i, 1)), "disk_id": c.disk_id, "host": c.host}
                 for i, c in enumerate(placed)]
        intent = json.dumps({"vid": vid, "units": units})
        await self.propose("kv_set", key=f"{INTENT_PREFIX}{vid}", value=intent)
        try:
            # Wait for every create to settle before judging: a release racing a create still in
            # flight would leave that chunk behind.
            created = await asyncio.gather(
                *(self.blobnodes.create_chunk(u["host"], u["disk_id"], u["vuid"], self.chunk_size) for u in units),
                return_exceptions=True)
            failed = next((r for r in created if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
            await self.propose("volume_create", vid=vid, code_mode=int(mode), backend=self.backend, units=units,
                               capacity=self.chunk_size * t.n)
        except (RpcError, PlacementError, OSError):
            with contextlib.suppress(RpcError):  # a failed roll back is retried from the intent
                await self.roll_back(vid, units)
            raise
        await self.propose("kv_delete", key=f"{INTENT_PREFIX}{vid}")
        log.info("created volume %d (%s) on disks %s", vid, mode.name, [u["disk_id"] for u in units])
        return int(vid)

    async def roll_back(self, vid: int, units: list[dict[str, Any]]) -> None:
        """Release every chunk an intent names, then drop the intent (idempotent)."""
        if not self.state.has_volume(vid):
            results = await asyncio.gather(
                *(self.blobnodes.release_chunk(u["host"], u["disk_id"], u["vuid"]) for u in units),
                return_exceptions=True)
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, NotFound)]
            if failed:
                raise failed[0]
            log.warning("rolled back half-created volume %d", vid)
        await self.propose("kv_delete", key=f"{INTENT_PREFIX}{vid}")

    async def roll_back_leftovers(self) -> None:
        """Finish every intent still present (a dead leader's, or one whose blobnode was down):
        roll it back, or, if its volume did commit, simply remove it."""
        for key, raw in self.state.kv_list(INTENT_PREFIX).items():
            intent = json.loads(raw)
            try:
                await self.roll_back(int(intent["vid"]), intent["units"])
            except RpcError as exc:
                log.warning("cannot roll back %s yet: %s", key, exc)
