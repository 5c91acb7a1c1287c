"""Volume creation on the leader: keep a floor of writable volumes of every enabled code mode, and a smaller
floor of those no lease holds, so an allocator can always lease one (when another allocator that held every volume
dies, its leases hold until they lapse).

Only volumes whose units are all on live, in-service disks count toward the floor, so when a disk dies
new volumes are created on the disks still heard from. Creation never takes a disk's last
`reserve` chunk slots: repair needs them to move units off a failed disk (CubeFS #3937). A disk whose
chunk creation failed is left out until it heartbeats again, so a dead node that has not yet missed
its heartbeat timeout does not fail every attempt; a hung one fails a creation (and a roll back) within
`chunk_timeout`, not the blobnode client's 30 s.

A volume is created in three steps, each durable before the next: (1) an intent naming the vid
and its chosen units is committed to the kv, (2) the chunks are created on the blobnodes,
(3) the volume is committed and the intent removed in order. If a step fails, or the leader dies
between steps, the intent is rolled back: every chunk it names is released, and only once every
blobnode has confirmed is the intent removed. The leader retries leftover intents every round (all but those of
the creations it runs now), so a chunk on a node that was down is released when it returns: no half-created volume
stays.

A failed step (3) may still have committed: the leader lost its leadership, or its answer timed out, after it
proposed. So a roll back releases nothing before a `volume_committed` read through the log says the volume was
not created (local state may lag, or not know yet); a node that cannot learn that (it no longer leads) releases
nothing and leaves the intent to the next leader, whose own reading is ordered after every entry of earlier terms.

A volume's capacity is the room its unit chunks have, in the bytes shards really take there (libs/space.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Collection

from pydantic import BaseModel

from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.placement import Candidate, PlacementError, candidates, place_volume
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import CodeModeRule
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import NotFound, RpcError
from blobstore_server.libs.rpc.tickets import Minter
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.commands.keys import KvDelete, KvSet, ScopeAlloc
from blobstore_server.services.clustermgr.commands.table import Proposer
from blobstore_server.services.clustermgr.commands.volumes import VolumeCommitted, VolumeCreate
from blobstore_server.services.clustermgr.health import unleased, volume_health
from blobstore_server.services.clustermgr.state import ClusterState

log = logging.getLogger(__name__)
INTENT_PREFIX = "volume_intent/"

class VolumeIntent(BaseModel):
    """Kept in the kv while a volume's chunks are created, so a failed creation can be rolled back."""

    vid: int
    units: list[Unit]


def volumes_short(state: ClusterState, rule: CodeModeRule, now: float, heartbeat_timeout: float,
                  largest_blob: int = 1) -> int:
    """How many volumes of the rule's mode to create so that `min_volumes` are writable and `min_idle_volumes` of
    those unleased; one without room for a blob of `largest_blob` bytes (the largest allocators asked for) is full.
    Stops judging once both floors are met: a large cluster's every volume is not judged every round."""
    disks = {d.disk_id: d for d in state.disks()}
    idle_floor = min(rule.min_idle_volumes, rule.min_volumes)  # a mode kept at no volumes keeps no spare either
    writable = idle = 0
    for volume in state.volumes():
        if (volume.code_mode != rule.code_mode or space.is_full(rule.code_mode, volume.free, largest_blob)
                or not volume_health(volume, disks, now, heartbeat_timeout).writable):
            continue
        writable += 1
        idle += unleased(volume, now)
        if writable >= rule.min_volumes and idle >= idle_floor:
            return 0
    return max(rule.min_volumes - writable, idle_floor - idle, 0)


class VolumeCreator:
    def __init__(self, state: ClusterState, propose: Proposer, blobnodes: BlobnodeClient, *,
                 idcs: list[str], backend: str, chunk_size: int, heartbeat_timeout: float, reserve: int,
                 chunk_timeout: float, tickets: Minter | None = None) -> None:
        self.state = state
        self.propose = propose
        self.blobnodes = blobnodes
        self.idcs = idcs
        self.backend = backend
        self.chunk_size = chunk_size
        self.heartbeat_timeout = heartbeat_timeout
        self.reserve = reserve
        self.chunk_timeout = chunk_timeout
        self.tickets = tickets  # signs the release of a rolled back volume's chunks (None: no auth, none needed)
        self.rng = random.Random()
        self._failed: dict[int, float] = {}  # disk id -> its last heartbeat when a chunk creation on it failed
        self._in_flight: set[int] = set()  # vids this leader is creating now: their intents are not leftovers

    def _usable(self, disk_id: int, last_heartbeat: float) -> bool:
        failed_at = self._failed.get(disk_id)
        if failed_at is not None and last_heartbeat <= failed_at:
            return False
        self._failed.pop(disk_id, None)
        return True

    async def create(self, mode: CodeMode, now: float, avoid_disks: Collection[int] = ()) -> int:
        """Create one volume of `mode`, on none of `avoid_disks`; returns its vid. Raises on failure after rolling
        back. Creations may run side by side (the floor's, one for avoided disks); a roll back of leftovers leaves
        their intents alone."""
        t = tactic(mode)
        disks = [d for d in self.state.disks()
                 if d.disk_id not in avoid_disks and self._usable(d.disk_id, d.last_heartbeat)]
        pool = candidates(disks, now, self.heartbeat_timeout, reserve=self.reserve)
        idcs = [idc for idc in self.idcs if any(c.idc == idc for c in pool)] if t.az_count > 1 else None
        placed = place_volume(t, pool, idcs=idcs, rng=self.rng)
        vid = (await self.propose(ScopeAlloc(name="vid", count=1))).start
        self._in_flight.add(vid)
        try:
            return await self._create_on(mode, vid, placed)
        finally:
            self._in_flight.discard(vid)

    async def _create_on(self, mode: CodeMode, vid: int, placed: list[Candidate]) -> int:
        intent = VolumeIntent(vid=vid, units=[Unit(vuid=Vuid.make(vid, i, 1), disk_id=c.disk_id, host=c.url)
                                              for i, c in enumerate(placed)])
        await self.propose(KvSet(key=f"{INTENT_PREFIX}{vid}", value=intent.model_dump_json()))
        try:
            # Wait for every create to settle before judging: a release racing a create still in
            # flight would leave that chunk behind.
            created = await asyncio.gather(
                *(self.blobnodes.create_chunk(u.host, u.disk_id, u.vuid, self.chunk_size, self.chunk_timeout)
                  for u in intent.units),
                return_exceptions=True)
            for unit, result in zip(intent.units, created, strict=True):
                if isinstance(result, BaseException):
                    self._failed[unit.disk_id] = self.state.disk(unit.disk_id).last_heartbeat
            failed = next((r for r in created if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
            await self.propose(VolumeCreate(vid=vid, code_mode=mode, backend=self.backend, units=intent.units,
                                            capacity=space.unit_capacity(self.chunk_size)))
        except (RpcError, PlacementError, OSError) as exc:
            with contextlib.suppress(RpcError):  # a failed roll back is retried from the intent
                if await self.roll_back(intent):
                    log.info("created volume %d (%s): committed though its answer was lost (%s)", vid, mode.name, exc)
                    return vid
            raise
        await self.propose(KvDelete(key=f"{INTENT_PREFIX}{vid}"))
        log.info("created volume %d (%s) on disks %s", vid, mode.name, [u.disk_id for u in intent.units])
        return vid

    async def roll_back(self, intent: VolumeIntent) -> bool:
        """Release every chunk an intent names unless its volume was committed, then drop the intent (idempotent).
        Answers whether the volume was committed; raises, releasing nothing, when the log cannot say (this node no
        longer leads)."""
        committed = (await self.propose(VolumeCommitted(vid=intent.vid))).committed
        if not committed:  # in the log's order: no unit of it is live, ever, so its chunks get release tickets
            results = await asyncio.gather(
                *(self.blobnodes.release_chunk(u.host, u.disk_id, u.vuid, self.chunk_timeout, ticket=self._ticket(u))
                  for u in intent.units),
                return_exceptions=True)
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, NotFound)]
            if failed:
                raise failed[0]
            log.warning("rolled back half-created volume %d", intent.vid)
        await self.propose(KvDelete(key=f"{INTENT_PREFIX}{intent.vid}"))
        return committed

    def _ticket(self, unit: Unit) -> str | None:
        return None if self.tickets is None else self.tickets.mint(unit.host, unit.disk_id, unit.vuid)

    async def roll_back_leftovers(self) -> None:
        """Finish every intent still present (a dead leader's, or one whose blobnode was down):
        roll it back, or, if its volume did commit, simply remove it."""
        for key, raw in self.state.kv_list(INTENT_PREFIX).items():
            intent = VolumeIntent.model_validate_json(raw)
            if intent.vid in self._in_flight:
                continue
            try:
                await self.roll_back(intent)
            except RpcError as exc:
                log.warning("cannot roll back %s yet: %s", key, exc)
