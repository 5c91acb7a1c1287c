"""Every clustermgr Raft command: its typed payload, its typed result, and the function that applies it.

`COMMANDS` maps the name written in the log to (model, apply function); nothing is looked up by
reflection. A command is logged as `{"op", "now", "args"}` with `args` the model's fields, the same
bytes as before commands were typed, so logs written earlier replay unchanged; a command sent in a
client session also carries `"session"` (see `sessions.py`). Applying is deterministic: the leader's
clock travels in `now`, and every choice (which disk, which vid) was made before proposing; applying
only validates and writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from blobstore_server.libs.ec import CodeMode, UnknownCodeMode, parse_code_mode, tactic
from blobstore_server.libs.kv import Batch
from blobstore_server.libs.placement import PlacementError, as_candidate, check_placement, shares_a_host
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.cluster import (
    DISK_TRANSITIONS,
    DiskInfo,
    ServiceInfo,
    Unit,
    VolumeHealth,
    VolumeInfo,
    VolumeStatus,
    write_fence_for,
)
from blobstore_server.libs.proto.clustermgr import (
    DiskAdd,
    Fence,
    HeartbeatAnswer,
    KeyRef,
    KeyValue,
    MaybeValue,
    Refused,
    Retained,
    RetainItem,
    RetainResult,
    ScopeRange,
    ServiceRef,
    UndeleteRecord,
    UndeleteTaken,
    VolumeList,
    VolumeView,
    lease_epoch,
    undelete_key,
)
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import BROKEN_AFTER_KEY, parse_broken_after
from blobstore_server.libs.rpc.errors import BadRequest, Conflict, Fenced, NotFound, RpcError, error_from_response
from blobstore_server.services.clustermgr.health import lease_rank, unleased, volume_health
from blobstore_server.services.clustermgr.sessions import LoggedSession
from blobstore_server.services.clustermgr.state import ClusterState

R = TypeVar("R", bound=BaseModel)


class Command(BaseModel, Generic[R]):
    """A command's payload; subclass as `Command[ResultModel]` and name it with `op`. Where a route's request body
    carries exactly the command's fields, the command is that body with an `op` (`class ScopeAlloc(api.ScopeAlloc,
    Command[ScopeRange])`): the route takes the command as its body and proposes it as it came."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    op: ClassVar[str]
    result_type: ClassVar[type[BaseModel]]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        # The result model is the generic argument: `class ScopeAlloc(Command[ScopeRange])`.
        for base in cls.__mro__:
            args = getattr(base, "__pydantic_generic_metadata__", {}).get("args")
            if args:
                cls.result_type = args[0]
                return


@dataclass(frozen=True)
class Entry:
    model: type[Command[Any]]
    apply: Callable[[ClusterState, Batch, float, Any], BaseModel]


COMMANDS: dict[str, Entry] = {}
C = TypeVar("C", bound=Command[Any])


def command(model: type[C]) -> Callable[[Callable[[ClusterState, Batch, float, C], R]],
                                        Callable[[ClusterState, Batch, float, C], R]]:
    """Register the function that applies `model` under `model.op`."""

    def register(apply: Callable[[ClusterState, Batch, float, C], R]) -> Callable[[ClusterState, Batch, float, C], R]:
        if model.op in COMMANDS:
            raise ValueError(f"command {model.op!r} is registered twice")
        COMMANDS[model.op] = Entry(model, apply)
        return apply

    return register


def encode(cmd: Command[Any], now: float, session: LoggedSession | None = None) -> bytes:
    entry: dict[str, object] = {"op": cmd.op, "now": now, "args": cmd.model_dump(mode="json")}
    if session is not None:
        entry["session"] = session.model_dump()
    return json.dumps(entry, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Logged:
    """One log entry, decoded: the command's name, the leader's clock, its raw args, its session."""

    op: str
    now: float
    args: Any
    session: LoggedSession | None


_MALFORMED = (ValueError, TypeError, KeyError, AttributeError)  # pydantic's ValidationError is a ValueError


def decode(raw: bytes) -> Logged:
    """Raises BadRequest for bytes that are not a logged command."""
    try:
        entry = json.loads(raw)
        session = entry.get("session")
        return Logged(str(entry.get("op", "")), float(entry["now"]), entry.get("args"),
                      None if session is None else LoggedSession.model_validate(session))
    except _MALFORMED as exc:
        raise BadRequest(f"malformed command: {exc}") from None


def apply(state: ClusterState, batch: Batch, logged: Logged) -> tuple[bytes, bool]:
    """Apply one logged command to `batch`: the answer every replica agrees on, and whether the command
    was accepted. A refused one may have written part of `batch`: the caller must drop it."""
    try:
        entry = COMMANDS.get(logged.op)
        if entry is None:
            raise BadRequest(f"unknown command {logged.op!r}")
        fence = logged.session.fence if logged.session else None
        if fence is not None:
            check_fence(state, fence)
        result = entry.apply(state, batch, logged.now, entry.model.model_validate(logged.args))
    except RpcError as exc:
        return refusal(exc), False
    except _MALFORMED as exc:
        return refusal(BadRequest(f"malformed command: {exc}")), False
    return json.dumps({"ok": result.model_dump(mode="json")}, separators=(",", ":")).encode(), True


def check_fence(state: ClusterState, fence: Fence) -> None:
    """Refuse a command sent under a lease epoch the lease record no longer carries: its holder was
    superseded (or never held it). Judged here, in the log's order, not by anyone's clock."""
    current = lease_epoch(state.kv_get(fence.key))
    if current != fence.epoch:
        raise Fenced(f"sent under epoch {fence.epoch} of lease {fence.key!r}, which is at epoch {current}: refused",
                     key=fence.key, epoch=current)


def refusal(exc: RpcError) -> bytes:
    """The answer of a refused command: the typed error, as every replica gives it."""
    return json.dumps({"error": exc.to_json()}, separators=(",", ":")).encode()


def decode_result(raw: bytes, result_type: type[R]) -> R:
    """The proposer's side of `apply`: the result, or the typed error every replica agreed on."""
    answer = json.loads(raw)
    if "error" in answer:
        raise error_from_response(0, answer["error"])
    return result_type.model_validate(answer["ok"])


# scopes


class ScopeAlloc(api.ScopeAlloc, Command[ScopeRange]):
    op = "scope_alloc"


@command(ScopeAlloc)
def scope_alloc(s: ClusterState, batch: Batch, now: float, cmd: ScopeAlloc) -> ScopeRange:
    start = s.scope(cmd.name) + 1
    s.put_scope(batch, cmd.name, start + cmd.count - 1)
    return ScopeRange(name=cmd.name, start=start, end=start + cmd.count - 1)


# disks


class DiskAddCmd(Command[DiskInfo]):
    op = "disk_add"
    disk: DiskAdd


@command(DiskAddCmd)
def disk_add(s: ClusterState, batch: Batch, now: float, cmd: DiskAddCmd) -> DiskInfo:
    # no answer has opened its node's write fence yet: the first beat's is the only one to wait out
    info = DiskInfo.model_validate({**cmd.disk.model_dump(), "last_heartbeat": now,
                                    "write_fence_s": write_fence_for(parse_broken_after(s.config(BROKEN_AFTER_KEY)))})
    if info.disk_id > s.scope("disk_id"):
        raise BadRequest(f"disk id {info.disk_id} was never allocated; use /disk/alloc_id")
    if s.has_disk(info.disk_id):
        raise Conflict(f"disk id {info.disk_id} is already registered")
    s.put_disk(batch, info)
    return info


class DiskHeartbeatCmd(api.DiskHeartbeat, Command[HeartbeatAnswer]):
    op = "disk_heartbeat"


@command(DiskHeartbeatCmd)
def disk_heartbeat(s: ClusterState, batch: Batch, now: float, cmd: DiskHeartbeatCmd) -> HeartbeatAnswer:
    """Answer each beat with the write fence `disk_broken_after` gives (as it stands in the log) and record with it
    how long the node may take writes after this beat: that fence, or a longer one an earlier answer gave that may
    still be open (the answer to this beat may never arrive), so whoever finds the disk silent can wait it out."""
    fence = write_fence_for(parse_broken_after(s.config(BROKEN_AFTER_KEY)))
    statuses = {}
    for beat in cmd.disks:
        info = s.disk(beat.disk_id)
        held = info.last_heartbeat + info.write_fence_s - now  # what is left of the fence recorded before
        s.put_disk(batch, info.model_copy(update={"size": beat.size, "free": beat.free, "chunks": beat.chunks,
                                                   "trash_bytes": beat.trash_bytes, "scrub_late_s": beat.scrub_late_s,
                                                   "last_heartbeat": now, "write_fence_s": max(fence, held)}))
        statuses[beat.disk_id] = info.status
    return HeartbeatAnswer(statuses=statuses, write_fence_s=fence)


class DiskSetCmd(api.DiskSet, Command[DiskInfo]):
    op = "disk_set"


@command(DiskSetCmd)
def disk_set(s: ClusterState, batch: Batch, now: float, cmd: DiskSetCmd) -> DiskInfo:
    info = s.disk(cmd.disk_id)
    if cmd.status is not None:
        if cmd.status != info.status and cmd.status not in DISK_TRANSITIONS[info.status]:
            raise Conflict(f"disk {cmd.disk_id} cannot go from {info.status} to {cmd.status}")
        info.status = cmd.status
    if cmd.readonly is not None:
        info.readonly = cmd.readonly
    s.put_disk(batch, info)
    return info


# volumes


class VolumeCreate(Command[VolumeInfo]):
    op = "volume_create"
    vid: int
    code_mode: int
    backend: str
    units: list[Unit]
    capacity: int


@command(VolumeCreate)
def volume_create(s: ClusterState, batch: Batch, now: float, cmd: VolumeCreate) -> VolumeInfo:
    try:
        mode = parse_code_mode(cmd.code_mode)
    except UnknownCodeMode as exc:
        raise BadRequest(str(exc)) from None
    if cmd.vid > s.scope("vid"):
        raise BadRequest(f"vid {cmd.vid} was never allocated")
    if s.has_volume(cmd.vid):
        raise Conflict(f"volume {cmd.vid} already exists")
    disks = [s.disk(u.disk_id) for u in cmd.units]
    try:
        check_placement(tactic(mode), [as_candidate(d) for d in disks])
    except PlacementError as exc:
        raise Conflict(f"volume {cmd.vid} placement refused: {exc}") from None
    for index, unit in enumerate(cmd.units):
        if Vuid(unit.vuid).vid() != cmd.vid or Vuid(unit.vuid).index() != index:
            raise BadRequest(f"unit {index} has vuid {unit.vuid} that does not name volume {cmd.vid}/{index}")
    for disk in disks:
        s.put_disk(batch, disk.model_copy(update={"chunks": disk.chunks + 1}))
    volume = VolumeInfo(vid=cmd.vid, code_mode=int(mode), backend=cmd.backend, units=cmd.units,
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
    code_mode: int
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
    mode = CodeMode(cmd.code_mode)
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


class UnitAllocCmd(Command[Unit]):
    op = "volume_unit_alloc"
    vid: int
    index: int
    disk_id: int


@command(UnitAllocCmd)
def volume_unit_alloc(s: ClusterState, batch: Batch, now: float, cmd: UnitAllocCmd) -> Unit:
    """Reserve a new chunk location for unit `index`: the same unit with epoch + 1."""
    volume = s.volume(cmd.vid)
    if not 0 <= cmd.index < len(volume.units):
        raise BadRequest(f"volume {cmd.vid} has no unit {cmd.index}")
    disk = s.disk(cmd.disk_id)
    if not disk.writable:
        raise Conflict(f"disk {cmd.disk_id} cannot take a unit (status {disk.status}, readonly {disk.readonly})")
    if any(u.disk_id == cmd.disk_id for i, u in enumerate(volume.units) if i != cmd.index):
        raise Conflict(f"disk {cmd.disk_id} already holds a unit of volume {cmd.vid}")
    current = Vuid(volume.units[cmd.index].vuid)
    pending = volume.pending_units.get(cmd.index)
    epoch = max(current.epoch(), Vuid(pending.vuid).epoch() if pending else 0,
                volume.dropped_epochs.get(cmd.index, 0)) + 1
    unit = Unit(vuid=Vuid.make(cmd.vid, cmd.index, epoch), disk_id=cmd.disk_id, host=disk.host)
    volume.pending_units[cmd.index] = unit
    s.put_volume(batch, volume)
    # Counted at once, as a volume's units are: the next reservations, made before the disk's next heartbeat
    # reports its chunks, then go to other disks instead of piling every move of a lost disk onto one.
    s.put_disk(batch, disk.model_copy(update={"chunks": disk.chunks + 1}))
    return unit


class UnitReleaseCmd(api.UnitRelease, Command[VolumeInfo]):
    op = "volume_unit_release"


@command(UnitReleaseCmd)
def volume_unit_release(s: ClusterState, batch: Batch, now: float, cmd: UnitReleaseCmd) -> VolumeInfo:
    """Ordered in the log after every unit switch, and fenced like them, it tells a scheduler whether the chunk it
    means to release is still no volume's live unit. Releasing the unit reserved for a move (a move given up)
    drops the reservation, so the volume can be unlocked; its epoch is never issued again, so a stale writer to
    that chunk stays refused."""
    volume = s.volume(cmd.vid)
    index = Vuid(cmd.vuid).index()
    if Vuid(cmd.vuid).vid() != cmd.vid or index >= len(volume.units):
        raise BadRequest(f"vuid {cmd.vuid} names no unit of volume {cmd.vid}")
    if volume.units[index].vuid == cmd.vuid:
        raise Conflict(f"vuid {cmd.vuid} is unit {index} of volume {cmd.vid}, live: its chunk stays")
    pending = volume.pending_units.get(index)
    if pending is not None and pending.vuid == cmd.vuid:
        del volume.pending_units[index]
        volume.dropped_epochs[index] = Vuid(cmd.vuid).epoch()
        s.put_volume(batch, volume)
    return volume


class UnitUpdateCmd(api.UnitUpdate, Command[VolumeInfo]):
    op = "volume_unit_update"


@command(UnitUpdateCmd)
def volume_unit_update(s: ClusterState, batch: Batch, now: float, cmd: UnitUpdateCmd) -> VolumeInfo:
    """Commit a moved unit; only the newest reserved epoch for that unit is accepted."""
    volume = s.volume(cmd.vid)
    if not 0 <= cmd.index < len(volume.units):
        raise BadRequest(f"volume {cmd.vid} has no unit {cmd.index}")
    pending = volume.pending_units.get(cmd.index)
    if pending is None or pending.vuid != cmd.vuid or pending.disk_id != cmd.disk_id:
        raise Conflict(f"unit {cmd.index} of volume {cmd.vid}: vuid {cmd.vuid} on disk {cmd.disk_id} is not the"
                       f" reserved move (current epoch {Vuid(volume.units[cmd.index].vuid).epoch()})")
    volume.units[cmd.index] = pending
    del volume.pending_units[cmd.index]
    volume.dropped_epochs.pop(cmd.index, None)  # below the live epoch now
    volume.under_spread = shares_a_host(s.disk(u.disk_id).machine for u in volume.units)
    s.put_volume(batch, volume)
    return volume


# services


class ServiceRegisterCmd(api.ServiceRegister, Command[ServiceInfo]):
    op = "service_register"


@command(ServiceRegisterCmd)
def service_register(s: ClusterState, batch: Batch, now: float, cmd: ServiceRegisterCmd) -> ServiceInfo:
    info = ServiceInfo(name=cmd.name, host=cmd.host, idc=cmd.idc, last_heartbeat=now, ttl=cmd.ttl)
    s.put_service(batch, info)
    return info


class ServiceHeartbeat(api.ServiceRef, Command[ServiceInfo]):
    op = "service_heartbeat"


@command(ServiceHeartbeat)
def service_heartbeat(s: ClusterState, batch: Batch, now: float, cmd: ServiceHeartbeat) -> ServiceInfo:
    info = s.service(cmd.name, cmd.host).model_copy(update={"last_heartbeat": now})
    s.put_service(batch, info)
    return info


class ServiceUnregister(api.ServiceRef, Command[ServiceRef]):
    op = "service_unregister"


@command(ServiceUnregister)
def service_unregister(s: ClusterState, batch: Batch, now: float, cmd: ServiceUnregister) -> ServiceRef:
    s.delete_service(batch, cmd.name, cmd.host)
    return ServiceRef(name=cmd.name, host=cmd.host)


# config and kv


class ConfigSet(api.KeyValue, Command[KeyValue]):
    op = "config_set"


@command(ConfigSet)
def config_set(s: ClusterState, batch: Batch, now: float, cmd: ConfigSet) -> KeyValue:
    s.put_config(batch, cmd.key, cmd.value)
    return KeyValue(key=cmd.key, value=cmd.value)


class ConfigDelete(api.KeyRef, Command[KeyRef]):
    op = "config_delete"


@command(ConfigDelete)
def config_delete(s: ClusterState, batch: Batch, now: float, cmd: ConfigDelete) -> KeyRef:
    s.put_config(batch, cmd.key, None)
    return KeyRef(key=cmd.key)


class KvSet(api.KeyValue, Command[KeyValue]):
    op = "kv_set"


@command(KvSet)
def kv_set(s: ClusterState, batch: Batch, now: float, cmd: KvSet) -> KeyValue:
    s.put_kv(batch, cmd.key, cmd.value)
    return KeyValue(key=cmd.key, value=cmd.value)


class KvDelete(api.KeyRef, Command[KeyRef]):
    op = "kv_delete"


@command(KvDelete)
def kv_delete(s: ClusterState, batch: Batch, now: float, cmd: KvDelete) -> KeyRef:
    s.put_kv(batch, cmd.key, None)
    return KeyRef(key=cmd.key)


class KvCas(api.KeyCas, Command[MaybeValue]):
    op = "kv_cas"


@command(KvCas)
def kv_cas(s: ClusterState, batch: Batch, now: float, cmd: KvCas) -> MaybeValue:
    """Set (or delete, value None) `key` only if it currently equals `expected` (None: absent)."""
    current = s.kv_get(cmd.key)
    if current != cmd.expected:
        raise Conflict(f"kv {cmd.key!r} is {current!r}, expected {cmd.expected!r}")
    s.put_kv(batch, cmd.key, cmd.value)
    return MaybeValue(key=cmd.key, value=cmd.value)


class UndeleteAdd(api.Undelete, Command[UndeleteTaken]):
    op = "undelete_add"


@command(UndeleteAdd)
def undelete_add(s: ClusterState, batch: Batch, now: float, cmd: UndeleteAdd) -> UndeleteTaken:
    """Record each slice as undeleted now, and forget the records past their time: they are collected as later
    undeletes come, so no more are ever kept than the undeletes of one `keep` span made."""
    kept = s.undelete_records()
    for key, record in kept.items():
        if record.until < now:
            s.put_kv(batch, key, None)
    for piece in cmd.slices:
        key = undelete_key(piece.vid, piece.min_bid)
        old = kept.get(key)
        record = UndeleteRecord(count=max(piece.count, old.count if old else 0), at=now,
                                until=max(now + cmd.keep, old.until if old else 0.0))
        s.put_kv(batch, key, record.model_dump_json())
    return UndeleteTaken(at=now)


class Proposer(Protocol):
    """Commits a command through Raft and answers its result (the manager's `propose`)."""

    async def __call__(self, cmd: Command[R], /) -> R: ...
