"""clustermgr HTTP routes: validate, then propose (writes) or read fresh state (reads)."""

from __future__ import annotations

import time
from collections import Counter

from fastapi import FastAPI, Query

from libs.ec import UnknownCodeMode, parse_code_mode
from libs.proto.cluster import DiskInfo, ServiceInfo, Unit, VolumeInfo, VolumeStatus
from libs.proto.clustermgr import (
    POLICY_KEY,
    ClusterStat,
    CodeModePolicy,
    ConfigList,
    DiskAdd,
    DiskHeartbeat,
    DiskId,
    DiskIds,
    DiskList,
    DiskSet,
    DiskView,
    KeyCas,
    KeyRef,
    KeyValue,
    KvItems,
    MaybeValue,
    MemberAdd,
    MemberRemove,
    RaftStatus,
    ReplicaStatus,
    RetainResult,
    ScopeAlloc,
    ScopeRange,
    ServiceList,
    ServiceRef,
    ServiceRegister,
    UnitAlloc,
    UnitUpdate,
    VolumeAlloc,
    VolumeHolder,
    VolumeList,
    VolumeRef,
    VolumeRetain,
    VolumeView,
)
from libs.rpc.errors import BadRequest
from libs.rpc.server import create_app
from services.clustermgr import commands as cmd
from services.clustermgr.manager import ClusterManager


def _code_mode(raw: int | str) -> int:
    try:
        return int(parse_code_mode(raw))
    except UnknownCodeMode as exc:
        raise BadRequest(str(exc)) from None


def build_app(cm: ClusterManager) -> FastAPI:
    app = create_app("clustermgr", on_start=cm.start, on_stop=cm.stop)
    lease_ttl = cm.config.volume_lease_ttl
    heartbeat_timeout = cm.config.disk_heartbeat_timeout

    @app.get("/raft/status")
    async def raft_status() -> ReplicaStatus:
        return ReplicaStatus(**cm.raft_status().model_dump(), node_id=cm.config.node_id,
                             checksum=cm.state.checksum(), applied_index=cm.state.applied_index())

    @app.post("/raft/member/add")
    async def member_add(req: MemberAdd) -> RaftStatus:
        return await cm.add_member(req.node_id, req.raft_addr, req.http_addr, req.learner)

    @app.post("/raft/member/remove")
    async def member_remove(req: MemberRemove) -> RaftStatus:
        return await cm.remove_member(req.node_id)

    # disks

    @app.post("/disk/alloc_id")
    async def disk_alloc_id() -> DiskId:
        return DiskId(disk_id=(await cm.propose(cmd.ScopeAlloc(name="disk_id", count=1))).start)

    @app.post("/disk/add")
    async def disk_add(req: DiskAdd) -> DiskInfo:
        return await cm.propose(cmd.DiskAddCmd(disk=req))

    @app.post("/disk/heartbeat")
    async def disk_heartbeat(req: DiskHeartbeat) -> DiskIds:
        return await cm.propose(cmd.DiskHeartbeatCmd(disks=req.disks))

    @app.post("/disk/set")
    async def disk_set(req: DiskSet) -> DiskInfo:
        if req.status is None and req.readonly is None:
            raise BadRequest("give a status, readonly, or both")
        return await cm.propose(cmd.DiskSetCmd(disk_id=req.disk_id, status=req.status, readonly=req.readonly))

    @app.get("/disk/get")
    async def disk_get(disk_id: int = Query(ge=1)) -> DiskView:
        return cm.disk_view((await cm.fresh()).disk(disk_id), time.time())

    @app.get("/disk/list")
    async def disk_list() -> DiskList:
        now = time.time()
        return DiskList(disks=[cm.disk_view(d, now) for d in (await cm.fresh()).disks()])

    # volumes

    @app.get("/volume/get")
    async def volume_get(vid: int = Query(ge=1)) -> VolumeView:
        return cm.volume_views([(await cm.fresh()).volume(vid)], time.time())[0]

    @app.get("/volume/list")
    async def volume_list(status: VolumeStatus | None = None, code_mode: int | None = None) -> VolumeList:
        volumes = (await cm.fresh()).volumes()
        return VolumeList(volumes=cm.volume_views([v for v in volumes if (status is None or v.status == status)
                                                   and (code_mode is None or v.code_mode == code_mode)], time.time()))

    @app.post("/volume/alloc")
    async def volume_alloc(req: VolumeAlloc) -> VolumeList:
        return await cm.propose(cmd.VolumeAllocCmd(code_mode=_code_mode(req.code_mode), holder=req.holder,
                                                   count=req.count, lease_ttl=lease_ttl,
                                                   heartbeat_timeout=heartbeat_timeout, avoid_disks=req.avoid_disks))

    @app.post("/volume/retain")
    async def volume_retain(req: VolumeRetain) -> RetainResult:
        return await cm.propose(cmd.VolumeRetainCmd(holder=req.holder, lease_ttl=lease_ttl, volumes=req.volumes,
                                                    heartbeat_timeout=heartbeat_timeout))

    @app.post("/volume/release")
    async def volume_release(req: VolumeHolder) -> VolumeInfo:
        return await cm.propose(cmd.VolumeRelease(vid=req.vid, holder=req.holder))

    @app.post("/volume/lock")
    async def volume_lock(req: VolumeRef) -> VolumeInfo:
        return await cm.propose(cmd.VolumeLock(vid=req.vid))

    @app.post("/volume/unlock")
    async def volume_unlock(req: VolumeRef) -> VolumeInfo:
        return await cm.propose(cmd.VolumeUnlock(vid=req.vid))

    @app.post("/volume/unit/alloc")
    async def unit_alloc(req: UnitAlloc) -> Unit:
        return await cm.alloc_unit(req.vid, req.index)

    @app.post("/volume/unit/update")
    async def unit_update(req: UnitUpdate) -> VolumeInfo:
        return await cm.propose(cmd.UnitUpdateCmd(vid=req.vid, index=req.index, vuid=req.vuid, disk_id=req.disk_id))

    # scopes, services, config, kv

    @app.post("/scope/alloc")
    async def scope_alloc(req: ScopeAlloc) -> ScopeRange:
        return await cm.propose(cmd.ScopeAlloc(name=req.name, count=req.count))

    @app.post("/service/register")
    async def service_register(req: ServiceRegister) -> ServiceInfo:
        return await cm.propose(cmd.ServiceRegisterCmd(name=req.name, host=req.host, idc=req.idc, ttl=req.ttl))

    @app.post("/service/heartbeat")
    async def service_heartbeat(req: ServiceRef) -> ServiceInfo:
        return await cm.propose(cmd.ServiceHeartbeat(name=req.name, host=req.host))

    @app.post("/service/unregister")
    async def service_unregister(req: ServiceRef) -> ServiceRef:
        return await cm.propose(cmd.ServiceUnregister(name=req.name, host=req.host))

    @app.get("/service/list")
    async def service_list(name: str | None = None, alive_only: bool = True) -> ServiceList:
        now = time.time()
        services = (await cm.fresh()).services(name)
        return ServiceList(services=[s for s in services if not alive_only or s.alive(now)])

    @app.get("/config/get")
    async def config_get(key: str) -> MaybeValue:
        return MaybeValue(key=key, value=(await cm.fresh()).config(key))

    @app.post("/config/set")
    async def config_set(req: KeyValue) -> KeyValue:
        if req.key == POLICY_KEY:
            try:
                CodeModePolicy.parse(req.value)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        return await cm.propose(cmd.ConfigSet(key=req.key, value=req.value))

    @app.get("/config/list")
    async def config_list() -> ConfigList:
        return ConfigList(config=(await cm.fresh()).configs())

    @app.get("/kv/get")
    async def kv_get(key: str) -> MaybeValue:
        return MaybeValue(key=key, value=(await cm.fresh()).kv_get(key))

    @app.post("/kv/set")
    async def kv_set(req: KeyValue) -> KeyValue:
        return await cm.propose(cmd.KvSet(key=req.key, value=req.value))

    @app.post("/kv/cas")
    async def kv_cas(req: KeyCas) -> MaybeValue:
        return await cm.propose(cmd.KvCas(key=req.key, expected=req.expected, value=req.value))

    @app.post("/kv/delete")
    async def kv_delete(req: KeyRef) -> KeyRef:
        return await cm.propose(cmd.KvDelete(key=req.key))

    @app.get("/kv/list")
    async def kv_list(prefix: str = "") -> KvItems:
        return KvItems(items=(await cm.fresh()).kv_list(prefix))

    @app.get("/stat")
    async def stat() -> ClusterStat:
        state = await cm.fresh()
        volumes = list(state.volumes())
        return ClusterStat(disks=sum(1 for _ in state.disks()), volumes=len(volumes),
                           volumes_by_status=Counter(v.status for v in volumes), raft=cm.raft_status())

    return app
