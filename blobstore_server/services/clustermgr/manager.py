"""clustermgr's async shell: Raft proposals in, state reads out, and the leader's background duties.

Writes are proposed through libs/raft and answered only once committed and applied here. Reads
that must be fresh first confirm leadership with a read-index round. A follower refuses both with
`NotLeader` naming the leader's HTTP address, which the client follows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.placement import PlacementError, replacement_disk
from blobstore_server.libs.proto.cluster import DiskInfo, Unit, VolumeInfo
from blobstore_server.libs.proto.clustermgr import (
    POLICY_KEY,
    CodeModePolicy,
    CodeModeRule,
    DiskView,
    EpochTicket,
    LeaderView,
    RaftStatus,
    Session,
    UnitAlloc,
    UnitReleased,
    VolumeList,
    VolumeView,
)
from blobstore_server.libs.proto.scheduler import BROKEN_AFTER_KEY, LEADER_KEY, LeaderRecord
from blobstore_server.libs.raft.config import RaftConfig, RaftTLS
from blobstore_server.libs.raft.errors import ConfigChangeInProgress, LeadershipLost, ProposalDropped
from blobstore_server.libs.raft.errors import NotLeader as RaftNotLeader
from blobstore_server.libs.raft.server import RaftServer
from blobstore_server.libs.rpc.errors import Conflict, Fenced, NotLeader, RpcError, Unavailable
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.libs.rpc.server import Lifecycle
from blobstore_server.libs.rpc.tickets import Kind, cluster_host
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.beats import HeartbeatBatcher
from blobstore_server.services.clustermgr.client import SessionClock
from blobstore_server.services.clustermgr.commands.keys import ConfigSet, KvSet
from blobstore_server.services.clustermgr.commands.table import Command, decode_result, encode
from blobstore_server.services.clustermgr.commands.units import (
    UnitAllocCmd,
    UnitReleaseCmd,
    UnitUpdateCmd,
    dead_for_good,
)
from blobstore_server.services.clustermgr.commands.volumes import VolumeAllocCmd
from blobstore_server.services.clustermgr.config import ClusterMgrConfig
from blobstore_server.services.clustermgr.destinations import check_destination
from blobstore_server.services.clustermgr.health import volume_health
from blobstore_server.services.clustermgr.machine import ClusterMachine
from blobstore_server.services.clustermgr.metrics import (
    FENCED,
    MOVES_REFUSED,
    PROPOSAL_SECONDS,
    VOLUME_CREATIONS_FAILED,
    VOLUMES_CREATED,
)
from blobstore_server.services.clustermgr.sessions import LoggedSession
from blobstore_server.services.clustermgr.state import ClusterState
from blobstore_server.services.clustermgr.volumes import VolumeCreator, volumes_short

log = logging.getLogger(__name__)
MEMBER_PREFIX = "raft_member_http/"
R = TypeVar("R", bound=BaseModel)


class ClusterManager:
    def __init__(self, config: ClusterMgrConfig) -> None:
        self.config = config
        data = Path(config.data_dir)
        # The Raft log is the durable record (replayed from the last snapshot at start), so the
        # state machine's own writes need no fsync.
        self.state = ClusterMachine(data / "state", sync=False)
        raft_config = RaftConfig(
            node_id=config.node_id,
            peers={node_id: m.raft_addr for node_id, m in config.members.items()
                   if not (config.join and node_id == config.node_id)},
            listen=config.me.raft_addr,
            join=config.join,
            data_dir=data / "raft",
            fsync=config.fsync,
            # a tick per heartbeat: nothing here needs finer timing, and each tick wakes all three replicas
            tick_ms=config.heartbeat_ms,
            heartbeat_ms=config.heartbeat_ms,
            election_ms=config.election_timeout_ms,
            snapshot_threshold=config.snapshot_threshold,
            snapshot_keep=config.snapshot_keep,
            # replicas prove membership with the admin key (only clustermgr, the scheduler and the operator hold it)
            member_key=config.auth.keys.get(Capability.RAFT_MEMBER) if config.auth else None,
            # replicas talk Raft over TLS with the certificate they serve HTTPS with
            tls=RaftTLS(**config.tls.model_dump()) if config.tls else None,
        )
        self.raft = RaftServer(raft_config, self.state)
        self.session = SessionClock(f"cm{config.node_id}-{secrets.token_hex(4)}")  # this replica's own commands
        self.blobnodes = BlobnodeClient()
        # release tickets (libs/rpc/tickets.py): none without auth, where blobnodes take releases without them
        self.tickets = config.auth.minter(Kind.RELEASE) if config.auth else None
        self.epoch_tickets = config.auth.minter(Kind.EPOCH) if config.auth else None  # signed with the release key
        self.volumes = VolumeCreator(self.state, self.propose, self.blobnodes, idcs=config.idcs,
                                     backend=config.codec_backend, chunk_size=config.chunk_size,
                                     heartbeat_timeout=config.disk_heartbeat_timeout,
                                     reserve=config.repair_reserve_chunks,
                                     chunk_timeout=config.chunk_request_timeout, tickets=self.tickets)
        self._create_failure: dict[CodeMode, str] = {}  # the last reason volume creation failed, per mode
        self._next_avoiding: dict[CodeMode, float] = {}  # monotonic time: no volume made for avoided disks before
        # The largest blob allocators asked room for, per mode: the floor counts only volumes with room for one
        # (a restarted leader learns it again from the next leases; until then it counts volumes with any room)
        self.largest_blob: dict[CodeMode, int] = {}
        # heartbeats are idempotent: committed without a session, the batch being nobody's one command
        self.heartbeats = HeartbeatBatcher(lambda report: self.submit(report, None), config.disk_heartbeat_batch)
        self._life = Lifecycle()
        self._life.loop(self._leader_duties)
        self._life.loop(self._die_on_invariant_violation)

    async def start(self) -> None:
        await self.raft.start()
        await self._life.start()

    async def _die_on_invariant_violation(self) -> None:
        error = await self.raft.wait_fatal()
        log.critical("Raft invariant violated, stopping this replica: %s", error)
        os._exit(70)

    async def stop(self) -> None:
        await self._life.stop()
        await self.raft.stop()
        await self.blobnodes.close()
        self.state.close()

    # Raft plumbing

    def leader_http(self, leader_id: int | None) -> str | None:
        if leader_id is None:
            return None
        member = self.config.members.get(leader_id)
        if member is not None:
            return f"{self.config.scheme}://{member.http_addr}"
        return self.state.kv_get(f"{MEMBER_PREFIX}{leader_id}")

    def _not_leader(self, exc: RaftNotLeader) -> NotLeader:
        leader = self.leader_http(exc.leader_hint)
        details = {"leader": leader} if leader else {}
        return NotLeader(f"clustermgr {self.config.node_id} does not lead; leader: {leader or 'unknown'}", **details)

    async def propose(self, cmd: Command[R]) -> R:
        """Commit a command of this replica's own (volume creation, policy publishing), in its session."""
        with self.session.command() as stamp:
            return await self.submit(cmd, stamp())

    async def submit(self, cmd: Command[R], session: Session | None) -> R:
        """Commit one command and return its result (or raise the error every replica agreed on). In a
        session, a retry of a command that already committed gets the first answer instead of applying
        again; without one (e.g. curl) it is applied as it comes."""
        started = time.perf_counter()
        logged = None if session is None else LoggedSession(**session.model_dump(), ttl=self.config.session_ttl,
                                                            limit=self.config.session_limit)
        try:
            raw = await self.raft.propose(encode(cmd, time.time(), logged))
        except RaftNotLeader as exc:
            raise self._not_leader(exc) from None
        except (ProposalDropped, LeadershipLost, TimeoutError) as exc:
            raise Unavailable(f"{cmd.op}: not committed ({type(exc).__name__}: {exc}); the outcome is unknown"
                              ) from None
        PROPOSAL_SECONDS.labels(cmd.op).observe(time.perf_counter() - started)
        try:
            return decode_result(raw, cmd.result_type)  # type: ignore[return-value]
        except Fenced as exc:
            FENCED.labels(str(exc.details.get("key", ""))).inc()
            log.warning("fenced %s from client %s: %s", cmd.op, session.client if session else "?", exc)
            raise

    async def release_unit(self, cmd: UnitReleaseCmd, session: Session | None) -> UnitReleased:
        """Commit a unit release (Conflict while the unit is live) and, when it names the chunk's disk, answer
        the chunk's release ticket: made here, after the log said the unit is dead for good."""
        volume = await self.submit(cmd, session)
        ticket = None
        if cmd.disk_id is not None and self.tickets is not None:
            if not dead_for_good(volume, cmd.vuid):
                raise Conflict(f"vuid {cmd.vuid} of volume {cmd.vid} was never issued: no release ticket for it")
            ticket = self.tickets.mint(self.state.disk(cmd.disk_id).host, cmd.disk_id, cmd.vuid)
        return UnitReleased.model_validate({**volume.model_dump(), "ticket": ticket})

    async def epoch_ticket(self, epoch: int) -> EpochTicket:
        """The blobnodes' ticket for scheduler lease `epoch`, only while the lease record holds it: an older one is
        Fenced (its holder was superseded), a newer one was never won."""
        raw = (await self.fresh()).kv_get(LEADER_KEY)
        held = LeaderRecord.model_validate_json(raw).epoch if raw else 0
        if epoch < held:
            raise Fenced(f"scheduler epoch {epoch} is superseded by {held}", epoch=held)
        if epoch > held:
            raise Conflict(f"scheduler epoch {epoch} was never won: the lease is at {held}")
        minter = self.epoch_tickets
        return EpochTicket(epoch=epoch, ticket=minter.mint(cluster_host(self.config.cluster_id), 0, 0, epoch)
                           if minter else None)

    async def fresh(self) -> ClusterState:
        """The state, after confirming this node leads and has applied everything committed."""
        try:
            await self.raft.read_index()
        except RaftNotLeader as exc:
            raise self._not_leader(exc) from None
        except TimeoutError:
            raise Unavailable("read-index timed out: leadership not confirmed") from None
        return self.state

    def is_leader(self) -> bool:
        return self.raft.is_leader()

    def leader_view(self) -> LeaderView:
        node = self.raft.node
        return LeaderView(node_id=node.id, role=node.role.value, term=node.term, leader=self.leader_http(node.leader))

    # leader duties

    async def _leader_duties(self) -> None:
        """Each round while this node leads: finish leftover volume intents, keep the volume floors. Only once a
        read-index in its term has applied everything committed before it (its own no-op of the term included):
        a round judged on a state that lags would create volumes that exist already."""
        fresh_term = 0  # the term in which this node last confirmed its lead with everything committed applied
        while True:
            await asyncio.sleep(self.config.volume_check_interval)
            try:
                term = self.raft.node.term
                if not self.is_leader():
                    continue
                if term != fresh_term:
                    await self.fresh()
                    await self.publish_defaults()
                    fresh_term = term
                await self.volumes.roll_back_leftovers()
                await self.ensure_volumes()
            except (NotLeader, Unavailable) as exc:
                log.info("leader duty interrupted: %s", exc)
                fresh_term = 0
            except Exception:
                log.exception("leader duty failed")

    async def publish_defaults(self) -> None:
        """Seed the code-mode size policy and `disk_broken_after` from this node's config unless an operator
        has set them."""
        if self.state.config(POLICY_KEY) is None:
            await self.propose(ConfigSet(key=POLICY_KEY, value=CodeModePolicy.dump(self.config.code_modes)))
        broken_after = self.config.disk_broken_after
        if broken_after is not None and self.state.config(BROKEN_AFTER_KEY) is None:
            await self.propose(ConfigSet(key=BROKEN_AFTER_KEY, value=str(broken_after)))

    def policy(self) -> list[CodeModeRule]:
        """The size policy in force: the replicated one (operators may change it), else this config's."""
        raw = self.state.config(POLICY_KEY)
        return self.config.code_modes if raw is None else CodeModePolicy.parse(raw)

    def _waiting_for_disks(self) -> bool:
        """Before the first volume: too few disks registered yet for the spread the launcher planned."""
        wanted = self.config.first_volume_after_disks
        return self.state.scope("vid") == 0 and sum(1 for _ in self.state.disks()) < wanted

    async def ensure_volumes(self) -> None:
        """Keep each enabled mode's floors of writable and of unleased volumes (see volumes.py)."""
        if self._waiting_for_disks():
            return
        for policy in self.policy():
            if not policy.enable:
                continue
            mode = policy.code_mode
            short = volumes_short(self.state, policy, time.time(), self.config.disk_heartbeat_timeout,
                                  self.largest_blob.get(mode, 1))
            for _ in range(short):
                try:
                    await self.volumes.create(mode, time.time())
                except Exception as exc:  # placement or a blobnode may fail; try again next round
                    self._creation_failed(mode, f"cannot create a {mode.name} volume yet: {exc}")
                    break
                VOLUMES_CREATED.labels("floor").inc()
                self._create_failure.pop(mode, None)

    def _creation_failed(self, mode: CodeMode, why: str) -> None:
        """Log why a volume could not be created; while too few disks live this repeats every round: say it once."""
        log.log(logging.DEBUG if self._create_failure.get(mode) == why else logging.WARNING, why)
        self._create_failure[mode] = why
        VOLUME_CREATIONS_FAILED.labels(mode.name).inc()

    async def lease_volumes(self, alloc: VolumeAllocCmd, session: Session | None) -> VolumeList:
        """Lease volumes to an allocator. When none it may lease keeps within the put slack on the disks its
        writers avoid (a partition can cut two units of every volume well before clustermgr judges those disks
        dead), first create one clear of them: writes resume after a creation, not a heartbeat timeout."""
        leased = await self.submit(alloc, session)
        short = alloc.count - len(leased.volumes)
        mode = alloc.code_mode
        now = time.monotonic()
        enabled = any(rule.enable and rule.code_mode is mode for rule in self.policy())
        if short <= 0 or not alloc.avoid_disks or not enabled or now < self._next_avoiding.get(mode, 0.0):
            return leased
        self._next_avoiding[mode] = now + self.config.avoiding_volume_interval
        try:
            await self.volumes.create(mode, time.time(), alloc.avoid_disks)
        except (RpcError, PlacementError, OSError) as exc:
            self._creation_failed(mode, f"cannot create a {mode.name} volume clear of disks {alloc.avoid_disks}: {exc}")
            return leased
        VOLUMES_CREATED.labels("avoiding").inc()
        more = await self.propose(alloc.model_copy(update={"count": short}))
        return VolumeList(volumes=[*leased.volumes, *more.volumes])

    # reads with derived fields

    def disk_view(self, disk: DiskInfo, now: float) -> DiskView:
        alive = disk.heard_from(now, self.config.disk_heartbeat_timeout)
        return DiskView.model_validate({**disk.model_dump(), "alive": alive})

    def asked_for(self, mode: CodeMode, largest_blob: int) -> None:
        """An allocator leases volumes of `mode` for blobs of up to `largest_blob` bytes."""
        self.largest_blob[mode] = max(self.largest_blob.get(mode, 1), largest_blob)

    def volume_views(self, volumes: Iterable[VolumeInfo], now: float) -> list[VolumeView]:
        """Volumes with whether new blobs may go to them now, and why not."""
        disks = {d.disk_id: d for d in self.state.disks()}
        return [VolumeView(**v.model_dump(), **volume_health(v, disks, now, self.config.disk_heartbeat_timeout)
                           .model_dump()) for v in volumes]

    async def alloc_unit(self, req: UnitAlloc, session: Session | None = None) -> Unit:
        """Reserve a new place for a volume's unit: the disk asked for (it must be alive) or one the placement
        policy chooses among the others, and the unit's next epoch."""
        state = await self.fresh()
        volume = state.volume(req.vid)
        now = time.time()
        disk_id = req.disk_id
        if disk_id is not None:
            if not state.disk(disk_id).heard_from(now, self.config.disk_heartbeat_timeout):
                raise Conflict(f"disk {disk_id} is not alive")
        else:
            unit_disks = [state.disk(u.disk_id) for u in volume.units]
            allowed = [d for d in state.disks() if d.disk_id not in req.avoid]
            try:
                disk_id = replacement_disk(tactic(volume.code_mode), unit_disks, req.index, allowed,
                                           now, self.config.disk_heartbeat_timeout)
            except PlacementError as exc:
                raise Conflict(f"volume {req.vid} unit {req.index}: {exc}") from None
        return await self.submit(UnitAllocCmd(vid=req.vid, index=req.index, disk_id=disk_id), session)

    async def update_unit(self, cmd: UnitUpdateCmd, session: Session | None) -> VolumeInfo:
        """Switch a volume's unit to its reserved move once the destination is seen to hold what the unit owes
        (`destinations`)."""
        volume = (await self.fresh()).volume(cmd.vid)
        pending = volume.pending_units.get(cmd.index)
        if pending is not None and pending.vuid == cmd.vuid and pending.disk_id == cmd.disk_id:
            try:
                await check_destination(self.blobnodes, volume, cmd.index, pending, set(cmd.lost),
                                        self.config.chunk_request_timeout)
            except Conflict:
                MOVES_REFUSED.inc()
                raise
        return await self.submit(cmd, session)  # the command refuses a move that is not the reserved one

    def raft_status(self) -> RaftStatus:
        return RaftStatus.model_validate(self.raft.status())

    async def add_member(self, node_id: int, raft_addr: str, http_addr: str, learner: bool,
                         session: Session | None = None) -> RaftStatus:
        await self.submit(KvSet(key=f"{MEMBER_PREFIX}{node_id}", value=f"{self.config.scheme}://{http_addr}"), session)
        if learner:
            return await self._membership(self.raft.add_learner(node_id, raft_addr))
        return await self._membership(self.raft.promote(node_id))

    async def remove_member(self, node_id: int) -> RaftStatus:
        return await self._membership(self.raft.remove(node_id))

    async def _membership(self, change: Awaitable[None]) -> RaftStatus:
        """A membership change; a retry of one is a no-op change, so a failure is worth retrying."""
        try:
            await change
        except RaftNotLeader as exc:
            raise self._not_leader(exc) from None
        except (ConfigChangeInProgress, LeadershipLost, TimeoutError) as exc:
            raise Unavailable(f"membership change not done ({type(exc).__name__}: {exc}); retry it") from None
        return self.raft_status()
