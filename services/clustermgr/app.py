"""clustermgr HTTP routes: validate, then propose (writes) or read fresh state (reads)."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI, Query
from pydantic import BaseModel, Field

from libs.ec import UnknownCodeMode, parse_code_mode, tactic
from libs.proto.cluster import DiskStatus, VolumeStatus
from libs.rpc.errors import BadRequest, Conflict
from libs.rpc.server import create_app
from services.clustermgr.config import CodeModePolicy
from services.clustermgr.manager import POLICY_KEY, ClusterManager
from services.clustermgr.placement import PlacementError, replace_unit
from services.clustermgr.volumes import as_candidate, candidates

U32 = Field(ge=0, lt=2**32)


class DiskAdd(BaseModel):
    disk_id: int = Field(ge=1, lt=2**32)
    host: str
    idc: str
    rack: str
    path: str
    size: int = Field(0, ge=0)
    free: int = Field(0, ge=0)
    max_chunks: int = Field(1024, ge=0)


class DiskBeat(BaseModel):
    disk_id: int = Field(ge=1, lt=2**32)
    size: int = Field(ge=0)
    free: int = Field(ge=0)
    chunks: int = Field(0, ge=0)


class DiskHeartbeat(BaseModel):
    disks: list[DiskBeat]


class DiskSet(BaseModel):
    disk_id: int = Field(ge=1, lt=2**32)
    status: DiskStatus | None = None
    readonly: bool | None = None


class VolumeAlloc(BaseModel):
    code_mode: int | str
    holder: str = Field(min_length=1)
    count: int = Field(1, ge=1, le=1000)


class RetainItem(BaseModel):
    vid: int = U32
    used: int = Field(0, ge=0)


class VolumeRetain(BaseModel):
    holder: str = Field(min_length=1)
    volumes: list[RetainItem]


class VolumeRef(BaseModel):
    vid: int = U32


class VolumeHolder(VolumeRef):
    holder: str


class UnitAlloc(VolumeRef):
    index: int = Field(ge=0, lt=256)


class UnitUpdate(UnitAlloc):
    vuid: int = Field(ge=0, lt=2**64)
    disk_id: int = Field(ge=1, lt=2**32)


class ScopeAlloc(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    count: int = Field(ge=1, le=1 << 32)


class ServiceRegister(BaseModel):
    name: str = Field(min_length=1)
    host: str = Field(min_length=1)
    idc: str = ""
    ttl: float = Field(30.0, gt=0)


class ServiceRef(BaseModel):
    name: str
    host: str


class KeyValue(BaseModel):
    key: str = Field(min_length=1)
    value: str


class KeyRef(BaseModel):
    key: str = Field(min_length=1)


class KeyCas(BaseModel):
    key: str = Field(min_length=1)
    expected: str | None
    value: str | None


class MemberAdd(BaseModel):
    node_id: int = Field(ge=1)
    raft_addr: str
    http_addr: str
    learner: bool = True


class MemberRemove(BaseModel):
    node_id: int = Field(ge=1)


def _code_mode(raw: int | str) -> int:
    try:
        return int(parse_code_mode(raw))
    except UnknownCodeMode as exc:
        raise BadRequest(str(exc)) from None


def _check_policy(raw: str) -> None:
    try:
        rules = json.loads(raw)
        if not isinstance(rules, list):
            raise ValueError("a list of rules is expected")
        for rule in rules:
            CodeModePolicy.model_validate(rule)
    except (ValueError, UnknownCodeMode) as exc:
        raise BadRequest(f"invalid {POLICY_KEY}: {exc}") from None


def build_app(cm: ClusterManager) -> FastAPI:
    app = create_app("clustermgr", on_start=cm.start, on_stop=cm.stop)
    lease_ttl = cm.config.volume_lease_ttl

    @app.get("/raft/status")
    async def raft_status() -> dict[str, Any]:
        return {**cm.raft.status(), "node_id": cm.config.node_id, "checksum": cm.state.checksum(),
                "applied_index": cm.state.applied_index()}

    @app.post("/raft/member/add")
    async def member_add(req: MemberAdd) -> dict[str, Any]:
        return await cm.add_member(req.node_id, req.raft_addr, req.http_addr, req.learner)

    @app.post("/raft/member/remove")
    async def member_remove(req: MemberRemove) -> dict[str, Any]:
        return await cm.remove_member(req.node_id)

    # disks

    @app.post("/disk/alloc_id")
    async def disk_alloc_id() -> dict[str, int]:
        return {"disk_id": (await cm.propose("scope_alloc", name="disk_id", count=1))["start"]}

    @app.post("/disk/add")
    async def disk_add(req: DiskAdd) -> dict[str, Any]:
        return await cm.propose("disk_add", disk=req.model_dump())

    @app.post("/disk/heartbeat")
    async def disk_heartbeat(req: DiskHeartbeat) -> dict[str, Any]:
        return await cm.propose("disk_heartbeat", disks=[d.model_dump() for d in req.disks])

    @app.post("/disk/set")
    async def disk_set(req: DiskSet) -> dict[str, Any]:
        if req.status is None and req.readonly is None:
            raise BadRequest("give a status, readonly, or both")
        return await cm.propose("disk_set", disk_id=req.disk_id, status=req.status, readonly=req.readonly)

    @app.get("/disk/get")
    async def disk_get(disk_id: int = Query(ge=1)) -> dict[str, Any]:
        return cm.disk_view((await cm.fresh()).disk(disk_id), time.time())

    @app.get("/disk/list")
    async def disk_list() -> dict[str, Any]:
        now = time.time()
        return {"disks": [cm.disk_view(d, now) for d in (await cm.fresh()).disks()]}

    # volumes

    @app.get("/volume/get")
    async def volume_get(vid: int = Query(ge=1)) -> dict[str, Any]:
        return (await cm.fresh()).volume(vid).model_dump()

    @app.get("/volume/list")
    async def volume_list(status: VolumeStatus | None = None, code_mode: int | None = None) -> dict[str, Any]:
        volumes = (await cm.fresh()).volumes()
        return {"volumes": [v.model_dump() for v in volumes
                            if (status is None or v.status == status)
                            and (code_mode is None or v.code_mode == code_mode)]}

    @app.post("/volume/alloc")
    async def volume_alloc(req: VolumeAlloc) -> dict[str, Any]:
        return await cm.propose("volume_alloc", code_mode=_code_mode(req.code_mode), holder=req.holder,
                                count=req.count, lease_ttl=lease_ttl)

    @app.post("/volume/retain")
    async def volume_retain(req: VolumeRetain) -> dict[str, Any]:
        return await cm.propose("volume_retain", holder=req.holder, lease_ttl=lease_ttl,
                                volumes=[v.model_dump() for v in req.volumes])

    @app.post("/volume/release")
    async def volume_release(req: VolumeHolder) -> dict[str, Any]:
        return await cm.propose("volume_release", vid=req.vid, holder=req.holder)

    @app.post("/volume/lock")
    async def volume_lock(req: VolumeRef) -> dict[str, Any]:
        return await cm.propose("volume_lock", vid=req.vid)

    @app.post("/volume/unlock")
    async def volume_unlock(req: VolumeRef) -> dict[str, Any]:
        return await cm.propose("volume_unlock", vid=req.vid)

    @app.post("/volume/unit/alloc")
    async def unit_alloc(req: UnitAlloc) -> dict[str, Any]:
        """Pick a replacement disk for one unit with the placement policy, then reserve epoch + 1."""
        state = await cm.fresh()
        volume = state.volume(req.vid)
        if req.index >= len(volume.units):
            raise BadRequest(f"volume {req.vid} has no unit {req.index}")
        disks = {d.disk_id: d for d in state.disks()}
        pool = candidates(list(disks.values()), time.time(), cm.config.disk_heartbeat_timeout)
        current = [as_candidate(disks[u.disk_id]) for u in volume.units]
        try:
            chosen = replace_unit(tactic(parse_code_mode(volume.code_mode)), current, req.index, pool)
        except PlacementError as exc:
            raise Conflict(f"volume {req.vid} unit {req.index}: {exc}") from None
        return await cm.propose("volume_unit_alloc", vid=req.vid, index=req.index, disk_id=chosen.disk_id)

    @app.post("/volume/unit/update")
    async def unit_update(req: UnitUpdate) -> dict[str, Any]:
        return await cm.propose("volume_unit_update", vid=req.vid, index=req.index, vuid=req.vuid,
                                disk_id=req.disk_id)

    # scopes, services, config, kv

    @app.post("/scope/alloc")
    async def scope_alloc(req: ScopeAlloc) -> dict[str, Any]:
        return await cm.propose("scope_alloc", name=req.name, count=req.count)

    @app.post("/service/register")
    async def service_register(req: ServiceRegister) -> dict[str, Any]:
        return await cm.propose("service_register", **req.model_dump())

    @app.post("/service/heartbeat")
    async def service_heartbeat(req: ServiceRef) -> dict[str, Any]:
        return await cm.propose("service_heartbeat", name=req.name, host=req.host)

    @app.post("/service/unregister")
    async def service_unregister(req: ServiceRef) -> dict[str, Any]:
        return await cm.propose("service_unregister", name=req.name, host=req.host)

    @app.get("/service/list")
    async def service_list(name: str | None = None, alive_only: bool = True) -> dict[str, Any]:
        now = time.time()
        services = (await cm.fresh()).services(name)
        return {"services": [s.model_dump() for s in services if not alive_only or s.alive(now)]}

    @app.get("/service/get")
    async def service_get(name: str) -> dict[str, Any]:
        return await service_list(name, True)

    @app.get("/config/get")
    async def config_get(key: str) -> dict[str, Any]:
        return {"key": key, "value": (await cm.fresh()).config(key)}

    @app.post("/config/set")
    async def config_set(req: KeyValue) -> dict[str, Any]:
        if req.key == POLICY_KEY:
            _check_policy(req.value)
        return await cm.propose("config_set", key=req.key, value=req.value)

    @app.get("/config/list")
    async def config_list() -> dict[str, Any]:
        return {"config": (await cm.fresh()).configs()}

    @app.get("/kv/get")
    async def kv_get(key: str) -> dict[str, Any]:
        return {"key": key, "value": (await cm.fresh()).kv_get(key)}

    @app.post("/kv/set")
    async def kv_set(req: KeyValue) -> dict[str, Any]:
        return await cm.propose("kv_set", key=req.key, value=req.value)

    @app.post("/kv/cas")
    async def kv_cas(req: KeyCas) -> dict[str, Any]:
        return await cm.propose("kv_cas", key=req.key, expected=req.expected, value=req.value)

    @app.post("/kv/delete")
    async def kv_delete(req: KeyRef) -> dict[str, Any]:
        return await cm.propose("kv_delete", key=req.key)

    @app.get("/kv/list")
    async def kv_list(prefix: str = "") -> dict[str, Any]:
        return {"items": (await cm.fresh()).kv_list(prefix)}

    @app.get("/stat")
    async def stat() -> dict[str, Any]:
        state = await cm.fresh()
        volumes = list(state.volumes())
        disks = list(state.disks())
        by_status: dict[str, int] = {}
        for v in volumes:
            by_status[v.status] = by_status.get(v.status, 0) + 1
        return {"disks": len(disks), "volumes": len(volumes), "volumes_by_status": by_status,
                "raft": cm.raft.status()}

    return app
