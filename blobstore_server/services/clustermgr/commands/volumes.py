"""Volume commands: creating volumes, leasing them, and their states."""

from __future__ import annotations

from pydantic import BaseModel, Field

from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.kv import Batch
from blobstore_server.libs.placement import PlacementError, as_candidate, check_placement, shares_a_host
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.cluster import Unit, VolumeHealth, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import Refused, Retained, RetainItem, RetainResult, VolumeList, VolumeView
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import BadRequest, Conflict, NotFound
from blobstore_server.services.clustermgr.commands.table import Command, command
from blobstore_server.services.clustermgr.health import lease_rank, unleased, volume_health
from blobstore_server.services.clustermgr.state import ClusterState


class VolumeCreate(Command[VolumeInfo]):
    op = "volume_create"
    vid: int
    code_mode: CodeMode
    backend: str
    units: list[Unit]
    capacity: int


@command(VolumeCreate)
def volume_create(s: ClusterState, batch: Batch, now: float, cmd: VolumeCreate) -> VolumeInfo:
    if cmd.vid > s.scope("vid"):
        raise BadRequest(f"vid {cmd.vid} was never allocated")
    if s.has_volume(cmd.vid):
        raise Conflict(f"volume {cmd.vid} already exists")
    disks = [s.disk(u.disk_id) for u in cmd.units]
    try:
        check_placement(tactic(cmd.code_mode), [as_candidate(d) for d in disks])
    except PlacementError as exc:
        raise Conflict(f"volume {cmd.vid} placement refused: {exc}") from None
    for index, unit in enumerate(cmd.units):
        if Vuid(unit.vuid).vid() != cmd.vid or Vuid(unit.vuid).index() != index:
            raise BadRequest(f"unit {index} has vuid {unit.vuid} that does not name volume {cmd.vid}/{index}")
    for disk in disks:
        s.put_disk(batch, disk.model_copy(update={"chunks": disk.chunks + 1}))
    volume = VolumeInfo(vid=cmd.vid, code_mode=cmd.code_mode, backend=cmd.backend, units=cmd.units,
                        capacity=cmd.capacity, under_spread=shares_a_host(d.machine for d in disks))
    s.put_volume(batch, volume)
    return volume


class VolumeOutcome(BaseModel):
    vid: int
    committed: bool


class VolumeCommitted(Command[VolumeOutcome]):
    """Was volume `vid` created? A read ordered through the log: answered after every entry before it, the
    proposer's own pending `volume_create` included, it settles a creation whose outcome was unknown. Once it
    says no, no creation of `vid` can still commit: one proposed before it would have been applied before it,
    and a leader proposes a vid's creation once."""

    op = "volume_committed"
    vid: int


@command(VolumeCommitted)
def volume_committed(s: ClusterState, batch: Batch, now: float, cmd: VolumeCommitted) -> VolumeOutcome:
    return VolumeOutcome(vid=cmd.vid, committed=s.has_volume(cmd.vid))


class VolumeAllocCmd(Command[VolumeList]):
    op = "volume_alloc"
    code_mode: CodeMode
    holder: str
    count: int
    lease_ttl: float
    min_free: int = 1  # bytes free on a unit: the asker's largest blob's (libs/space.py `is_full`); 1 in old logs
    # Set: lease volumes whose units are all up (and off `avoid_disks`) first, well-spread before
    # under-spread, and never one that would miss its put quorum. None (logs written before health
    # existed): in vid order, as then.
    heartbeat_timeout: float | None = None
    avoid_disks: list[int] = Field(default_factory=list)
    reclaim: bool = False  # also the volumes `holder` leases already (see VolumeAlloc)


@command(VolumeAllocCmd)
def volume_alloc(s: ClusterState, batch: Batch, now: float, cmd: VolumeAllocCmd) -> VolumeList:
    """Lease up to `count` idle (or lapsed, or with `reclaim` the holder's own) volumes of a mode to `holder`."""
    mode = cmd.code_mode
    disks = {d.disk_id: d for d in s.disks()} if cmd.heartbeat_timeout is not None else {}
    avoid = set(cmd.avoid_disks)
    ranked: list[tuple[tuple[int, bool, int], VolumeInfo, VolumeHealth]] = []
    best = 0  # volumes ranked (0, False): in vid order, so once `count` of them are found no later one can win
    for volume in s.volumes():
        if best == cmd.count:
            break
        leasable = unleased(volume, now) or (cmd.reclaim and volume.status is VolumeStatus.ACTIVE
                                             and volume.lease_holder == cmd.holder)
        if volume.code_mode != mode or volume.free < cmd.min_free or not leasable:
            continue
        if cmd.heartbeat_timeout is None:
            ranked.append(((0, False, volume.vid), volume, VolumeHealth()))
            best += 1
            continue
        health = volume_health(volume, disks, now, cmd.heartbeat_timeout)
        rank = lease_rank(tactic(mode), volume, health, avoid)
        if rank is not None:
            ranked.append(((rank, volume.under_spread, volume.vid), volume, health))
            best += rank == 0 and not volume.under_spread
    leased = []
    for _, volume, health in sorted(ranked, key=lambda r: r[0])[: cmd.count]:
        volume = volume.model_copy(update={"status": VolumeStatus.ACTIVE, "lease_holder": cmd.holder,
                                           "lease_expiry": now + cmd.lease_ttl})
        s.put_volume(batch, volume)
        leased.append(VolumeView(**volume.model_dump(), **health.model_dump()))
    return VolumeList(volumes=leased, lease_for=cmd.lease_ttl)


def _leased(s: ClusterState, vid: int, holder: str, now: float) -> VolumeInfo:
    volume = s.volume(vid)
    if volume.status is not VolumeStatus.ACTIVE or volume.lease_holder != holder:
        raise Conflict(f"volume {vid} is not leased to {holder!r} (status {volume.status},"
                       f" holder {volume.lease_holder!r})")
    if volume.lease_expiry < now:
        raise Conflict(f"the lease of volume {vid} by {holder!r} lapsed; lease it anew")
    return volume


class VolumeRetainCmd(Command[RetainResult]):
    op = "volume_retain"
    holder: str
    lease_ttl: float
    volumes: list[RetainItem]
    heartbeat_timeout: float | None = None  # set: each renewal carries the volume's health


@command(VolumeRetainCmd)
def volume_retain(s: ClusterState, batch: Batch, now: float, cmd: VolumeRetainCmd) -> RetainResult:
    """Renew leases and tell the holder which volumes can take writes: it stops allocating from the others."""
    result = RetainResult(retained=[], refused=[], lease_for=cmd.lease_ttl)
    disks = {d.disk_id: d for d in s.disks()} if cmd.heartbeat_timeout is not None else {}
    for item in cmd.volumes:
        try:
            volume = _leased(s, item.vid, cmd.holder, now)
        except (Conflict, NotFound) as exc:
            result.refused.append(Refused(vid=item.vid, reason=exc.message))
            continue
        volume = volume.model_copy(update={"lease_expiry": now + cmd.lease_ttl, "used": max(volume.used, item.used)})
        s.put_volume(batch, volume)
        health = (VolumeHealth() if cmd.heartbeat_timeout is None
                  else volume_health(volume, disks, now, cmd.heartbeat_timeout))
        result.retained.append(Retained(vid=volume.vid, lease_expiry=volume.lease_expiry, **health.model_dump()))
    return result


class VolumeRelease(api.VolumeHolder, Command[VolumeInfo]):
    op = "volume_release"


@command(VolumeRelease)
def volume_release(s: ClusterState, batch: Batch, now: float, cmd: VolumeRelease) -> VolumeInfo:
    volume = s.volume(cmd.vid)
    if volume.status is VolumeStatus.ACTIVE and volume.lease_holder == cmd.holder:
        volume = volume.model_copy(update={"status": VolumeStatus.IDLE, "lease_holder": "", "lease_expiry": 0.0})
        s.put_volume(batch, volume)
    return volume


class VolumeFull(api.VolumeRef, Command[VolumeInfo]):
    op = "volume_full"


@command(VolumeFull)
def volume_full(s: ClusterState, batch: Batch, now: float, cmd: VolumeFull) -> VolumeInfo:
    """A blobnode refused a shard of the volume for want of room: it takes no more blobs, and its lease ends, so the
    holder drops it at its next renewal and no allocator leases it again. A locked volume stays locked."""
    volume = s.volume(cmd.vid)
    update: dict[str, object] = {"used": max(volume.used, volume.capacity)}
    if volume.status is VolumeStatus.ACTIVE:
        update.update(status=VolumeStatus.IDLE, lease_holder="", lease_expiry=0.0)
    volume = volume.model_copy(update=update)
    s.put_volume(batch, volume)
    return volume


class VolumeLock(api.VolumeRef, Command[VolumeInfo]):
    op = "volume_lock"


@command(VolumeLock)
def volume_lock(s: ClusterState, batch: Batch, now: float, cmd: VolumeLock) -> VolumeInfo:
    volume = s.volume(cmd.vid).model_copy(update={"status": VolumeStatus.LOCK, "lease_holder": "",
                                                  "lease_expiry": 0.0})
    s.put_volume(batch, volume)
    return volume


class VolumeUnlock(api.VolumeRef, Command[VolumeInfo]):
    op = "volume_unlock"


@command(VolumeUnlock)
def volume_unlock(s: ClusterState, batch: Batch, now: float, cmd: VolumeUnlock) -> VolumeInfo:
    volume = s.volume(cmd.vid)
    if volume.status is not VolumeStatus.LOCK:
        raise Conflict(f"volume {cmd.vid} is {volume.status}, not locked")
    if volume.pending_units:
        raise Conflict(f"volume {cmd.vid} still moves units {sorted(volume.pending_units)}")
    volume = volume.model_copy(update={"status": VolumeStatus.IDLE})
    s.put_volume(batch, volume)
    return volume
