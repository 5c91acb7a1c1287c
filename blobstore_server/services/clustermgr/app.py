"""clustermgr HTTP routes: validate, then propose (writes) or read fresh state (reads).

Every write route takes the caller's session from `SESSION_HEADER` (`Caller`): a retried command then
gets its first answer back instead of applying twice. A request without one is applied as it comes.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from pydantic import BaseModel

from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.cluster import DiskInfo, DiskStatus, Unit, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import (
    KV_PAGE,
    SESSION_HEADER,
    ClusterStat,
    ConfigList,
    DiskAdd,
    DiskId,
    DiskList,
    DiskRef,
    DiskView,
    DropReplies,
    EpochAsk,
    EpochTicket,
    HeartbeatAnswer,
    KeyValue,
    KvItems,
    LeaderView,
    MaybeValue,
    MemberAdd,
    MemberRemove,
    RaftStatus,
    ReplicaStatus,
    RetainResult,
    ScopeRange,
    ServiceList,
    Session,
    Undeleted,
    UnitAlloc,
    UnitReleased,
    VolumeAlloc,
    VolumeList,
    VolumeRetain,
    VolumeView,
    parse_undelete_looks,
)
from blobstore_server.libs.proto.runtime_keys import check_runtime_value
from blobstore_server.libs.rpc.auth import CALLER_SCOPE_KEY
from blobstore_server.libs.rpc.errors import BadRequest, Forbidden, NotFound
from blobstore_server.libs.rpc.routes import Route
from blobstore_server.libs.rpc.server import ASGIApp, create_app, serves
from blobstore_server.services.clustermgr.callers import check_disk_move, check_holder, check_scope_request
from blobstore_server.services.clustermgr.commands.disks import DiskAddCmd, DiskHeartbeatCmd, DiskSetCmd
from blobstore_server.services.clustermgr.commands.keys import (
    ConfigSet,
    KvCas,
    KvDelete,
    KvSet,
    ScopeAlloc,
    UndeleteAdd,
)
from blobstore_server.services.clustermgr.commands.services import (
    ServiceHeartbeat,
    ServiceRegisterCmd,
    ServiceUnregister,
)
from blobstore_server.services.clustermgr.commands.table import Command
from blobstore_server.services.clustermgr.commands.units import UnitReleaseCmd, UnitUpdateCmd
from blobstore_server.services.clustermgr.commands.volumes import (
    VolumeAllocCmd,
    VolumeFull,
    VolumeLock,
    VolumeRelease,
    VolumeRetainCmd,
    VolumeUnlock,
)
from blobstore_server.services.clustermgr.faults import ReplyCutter
from blobstore_server.services.clustermgr.manager import ClusterManager


async def _session(raw: Annotated[str | None, Header(alias=SESSION_HEADER)] = None) -> Session | None:
    if raw is None:
        return None
    try:
        return Session.parse(raw)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


Caller = Annotated[Session | None, Depends(_session)]


async def _signed_by(request: Request) -> str | None:
    """The identity that signed a disk report or a lease request (None when this clustermgr runs without auth)."""
    caller = request.scope.get(CALLER_SCOPE_KEY)
    return None if caller is None else caller.identity


SignedBy = Annotated[str | None, Depends(_signed_by)]


def _owned(cm: ClusterManager, reporter: str | None, disk_ids: list[int]) -> None:
    """Forbidden unless every disk is the reporter's own (a blobnode reports only its disks)."""
    if reporter is None:
        return
    for disk_id in disk_ids:
        try:
            host = cm.state.disk(disk_id).host
        except NotFound:
            continue  # the command itself says so
        if host != reporter:
            raise Forbidden(f"disk {disk_id} belongs to {host}, not to the caller {reporter}")


# Routes whose body is the command they commit, as it came (`Command`): route -> that command. The route's
# declaration names its body and answer; `serves` refuses a command that is not that body or answers otherwise.
PROPOSED: tuple[tuple[Route[Any], type[Command[Any]]], ...] = (
    (api.VOLUME_FULL, VolumeFull),
    (api.VOLUME_LOCK, VolumeLock),
    (api.VOLUME_UNLOCK, VolumeUnlock),
    (api.SERVICE_REGISTER, ServiceRegisterCmd),
    (api.SERVICE_HEARTBEAT, ServiceHeartbeat),
    (api.SERVICE_UNREGISTER, ServiceUnregister),
    (api.KV_SET, KvSet),
    (api.KV_CAS, KvCas),
    (api.KV_DELETE, KvDelete),
    (api.UNDELETE_ADD, UndeleteAdd),
)


def _serve_proposed(app: FastAPI, cm: ClusterManager, route: Route[Any],
                    command: type[Command[Any]]) -> None:
    async def propose(req: Command[Any], caller: Caller) -> BaseModel:
        return await cm.submit(req, caller)

    # FastAPI parses the body as the annotation says: this route's command, answered as its result
    propose.__annotations__ = {"req": command, "caller": Caller, "return": command.result_type}
    propose.__name__ = propose.__qualname__ = command.op
    serves(app, route)(propose)


def _serve_raft(app: FastAPI, cm: ClusterManager) -> None:
    @serves(app, api.RAFT_STATUS)
    async def raft_status() -> ReplicaStatus:
        return ReplicaStatus(**cm.raft_status().model_dump(), node_id=cm.config.node_id,
                             checksum=cm.state.checksum(), applied_index=cm.state.applied_index())

    @serves(app, api.RAFT_LEADER)
    async def raft_leader() -> LeaderView:
        return cm.leader_view()

    @serves(app, api.RAFT_MEMBER_ADD)
    async def member_add(req: MemberAdd, caller: Caller) -> RaftStatus:
        return await cm.add_member(req.node_id, req.raft_addr, req.http_addr, req.learner, caller)

    @serves(app, api.RAFT_MEMBER_REMOVE)
    async def member_remove(req: MemberRemove) -> RaftStatus:
        return await cm.remove_member(req.node_id)


def _serve_disks(app: FastAPI, cm: ClusterManager) -> None:
    @serves(app, api.DISK_ALLOC_ID)
    async def disk_alloc_id(caller: Caller) -> DiskId:
        return DiskId(disk_id=(await cm.submit(ScopeAlloc(name="disk_id", count=1), caller)).start)

    @serves(app, api.DISK_ADD)
    async def disk_add(req: DiskAdd, caller: Caller, reporter: SignedBy) -> DiskInfo:
        if reporter is not None and req.host != reporter:
            raise Forbidden(f"{reporter} may add only its own disks, not one of {req.host}")
        _owned(cm, reporter, [req.disk_id])
        return await cm.submit(DiskAddCmd(disk=req), caller)

    @serves(app, api.DISK_HEARTBEAT)
    async def disk_heartbeat(req: DiskHeartbeatCmd, reporter: SignedBy) -> HeartbeatAnswer:
        _owned(cm, reporter, [d.disk_id for d in req.disks])
        for beat in req.disks:  # here, so that an unknown disk fails its own report, not the whole batch
            cm.state.disk(beat.disk_id)
        return await cm.heartbeats.beat(req)

    @serves(app, api.DISK_SET)
    async def disk_set(req: DiskSetCmd, caller: Caller) -> DiskInfo:
        if req.status is None and req.readonly is None:
            raise BadRequest("give a status, readonly, or both")
        state = await cm.fresh()
        units_left = sum(1 for v in state.volumes() for u in v.units if u.disk_id == req.disk_id)
        check_disk_move(req.disk_id, state.disk(req.disk_id).status, req.status, units_left)
        return await cm.submit(req, caller)

    @serves(app, api.DISK_BROKEN)
    async def disk_broken(req: DiskRef, caller: Caller, reporter: SignedBy) -> DiskInfo:
        """A blobnode reporting its own disk failing: the one status change a data-path service may make."""
        _owned(cm, reporter, [req.disk_id])
        return await cm.submit(DiskSetCmd(disk_id=req.disk_id, status=DiskStatus.BROKEN), caller)

    @serves(app, api.DISK_GET)
    async def disk_get(disk_id: int = Query(ge=1)) -> DiskView:
        return cm.disk_view((await cm.fresh()).disk(disk_id), time.time())

    @serves(app, api.DISK_LIST)
    async def disk_list() -> DiskList:
        now = time.time()
        return DiskList(disks=[cm.disk_view(d, now) for d in (await cm.fresh()).disks()])


def _serve_volumes(app: FastAPI, cm: ClusterManager) -> None:
    lease_ttl = cm.config.volume_lease_ttl
    heartbeat_timeout = cm.config.disk_heartbeat_timeout

    @serves(app, api.VOLUME_GET)
    async def volume_get(vid: int = Query(ge=1)) -> VolumeView:
        return cm.volume_views([(await cm.fresh()).volume(vid)], time.time())[0]

    @serves(app, api.VOLUME_LIST)
    async def volume_list(status: VolumeStatus | None = None, code_mode: CodeMode | None = None,
                          since: int | None = Query(None, ge=0)) -> VolumeList:
        if since is not None and (status is not None or code_mode is not None):
            raise BadRequest("`since` lists every volume changed (a filter would hide one that left it): "
                             "filter on your side")
        state = await cm.fresh()
        volumes = state.volumes() if since is None else state.volumes_changed_since(since)
        return VolumeList(volumes=cm.volume_views([v for v in volumes if (status is None or v.status == status)
                                                   and (code_mode is None or v.code_mode == code_mode)], time.time()),
                          revision=state.applied_index())

    @serves(app, api.VOLUME_ALLOC)
    async def volume_alloc(req: VolumeAlloc, caller: Caller, signer: SignedBy) -> VolumeList:
        mode = req.code_mode
        check_holder(signer, req.holder)
        alloc = VolumeAllocCmd(code_mode=mode, holder=req.holder, count=req.count, lease_ttl=lease_ttl,
                                   min_free=space.blob_bytes(mode, req.largest_blob),
                                   heartbeat_timeout=heartbeat_timeout,
                                   avoid_disks=req.avoid_disks, reclaim=req.reclaim)
        cm.asked_for(mode, req.largest_blob)
        return await cm.lease_volumes(alloc, caller)

    @serves(app, api.VOLUME_RETAIN)
    async def volume_retain(req: VolumeRetain, caller: Caller, signer: SignedBy) -> RetainResult:
        check_holder(signer, req.holder)
        retain = VolumeRetainCmd(holder=req.holder, lease_ttl=lease_ttl, volumes=req.volumes,
                                 heartbeat_timeout=heartbeat_timeout)
        return await cm.submit(retain, caller)

    @serves(app, api.VOLUME_RELEASE)
    async def volume_release(req: VolumeRelease, caller: Caller, signer: SignedBy) -> VolumeInfo:
        check_holder(signer, req.holder)
        return await cm.submit(req, caller)

    @serves(app, api.SCOPE_ALLOC)
    async def scope_alloc(req: ScopeAlloc, caller: Caller) -> ScopeRange:
        check_scope_request(req.name, req.count)
        return await cm.submit(req, caller)

    @serves(app, api.UNIT_ALLOC)
    async def unit_alloc(req: UnitAlloc, caller: Caller) -> Unit:
        return await cm.alloc_unit(req, caller)

    @serves(app, api.EPOCH_TICKET)
    async def epoch_ticket(req: EpochAsk) -> EpochTicket:
        return await cm.epoch_ticket(req.epoch)

    @serves(app, api.UNIT_UPDATE)
    async def unit_update(req: UnitUpdateCmd, caller: Caller) -> VolumeInfo:
        return await cm.update_unit(req, caller)

    @serves(app, api.UNIT_RELEASE)
    async def unit_release(req: UnitReleaseCmd, caller: Caller) -> UnitReleased:
        return await cm.release_unit(req, caller)


def _serve_config(app: FastAPI, cm: ClusterManager) -> None:
    @serves(app, api.CONFIG_GET)
    async def config_get(key: str) -> MaybeValue:
        return MaybeValue(key=key, value=(await cm.fresh()).config(key))

    @serves(app, api.CONFIG_SET)
    async def config_set(req: ConfigSet, caller: Caller) -> KeyValue:
        try:
            check_runtime_value(req.key, req.value)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return await cm.submit(req, caller)

    @serves(app, api.CONFIG_LIST)
    async def config_list() -> ConfigList:
        return ConfigList(config=(await cm.fresh()).configs())


def _serve_reads(app: FastAPI, cm: ClusterManager) -> None:
    """The reads of fresh state the other groups leave: services, kv, undelete records, the cluster's figures."""

    @serves(app, api.SERVICE_LIST)
    async def service_list(name: str | None = None, alive_only: bool = True) -> ServiceList:
        now = time.time()
        services = (await cm.fresh()).services(name)
        return ServiceList(services=[s for s in services if not alive_only or s.alive(now)])

    @serves(app, api.KV_GET)
    async def kv_get(key: str) -> MaybeValue:
        return MaybeValue(key=key, value=(await cm.fresh()).kv_get(key))

    @serves(app, api.KV_LIST)
    async def kv_list(prefix: str = "", after: str = "", count: int = Query(KV_PAGE, ge=1, le=KV_PAGE)) -> KvItems:
        items = (await cm.fresh()).kv_list(prefix, after, count)
        return KvItems(items=items, next_after=next(reversed(items)) if len(items) == count else None)

    @serves(app, api.UNDELETE_GET)
    async def undelete_get(vids: str, bids: str) -> Undeleted:
        blobs = parse_undelete_looks(vids, bids)
        state = await cm.fresh()
        return Undeleted(at=[state.undeleted_at(vid, bid) for vid, bid in blobs])

    @serves(app, api.STAT)
    async def stat() -> ClusterStat:
        state = await cm.fresh()
        volumes = list(state.volumes())
        return ClusterStat(disks=sum(1 for _ in state.disks()), volumes=len(volumes),
                           volumes_by_status=Counter(v.status for v in volumes), sessions=state.sessions(),
                           raft=cm.raft_status())


def _with_fault_hooks(app: FastAPI) -> ReplyCutter:
    cutter = ReplyCutter(app)

    @serves(app, api.DROP_REPLY)
    async def drop_reply(req: DropReplies) -> DropReplies:
        cutter.armed[req.path] = req.count
        return req

    return cutter


def build_app(cm: ClusterManager) -> ASGIApp:
    app = create_app("clustermgr", on_start=cm.start, on_stop=cm.stop)
    for serve in (_serve_raft, _serve_disks, _serve_volumes, _serve_config, _serve_reads):
        serve(app, cm)
    for route, command in PROPOSED:
        _serve_proposed(app, cm, route, command)
    return _with_fault_hooks(app) if cm.config.fault_hooks else app
