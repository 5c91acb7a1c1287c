"""Typed async client of clustermgr: finds the leader and retries across a leader change.

Every call goes to the replica believed to lead; a follower answers `NotLeader` naming the
leader, an unreachable replica is skipped, and the call is retried until `deadline` seconds
have passed, which covers an election (well under 2 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from libs.proto.cluster import DiskInfo, ServiceInfo, Unit, VolumeInfo
from libs.rpc.client import HttpClient, Params, ServiceClient
from libs.rpc.errors import NotFound, NotLeader, Unavailable


class ClusterClient(ServiceClient):
    def __init__(self, hosts: Sequence[str], *, http: HttpClient | None = None, deadline: float = 10.0) -> None:
        if not hosts:
            raise ValueError("clustermgr client needs at least one host")
        super().__init__(http, timeout=10.0)
        self.hosts = [h.rstrip("/") for h in hosts]
        self.deadline = deadline
        self._leader = self.hosts[0]




    async def call(self, method: str, path: str, *, params: Params | None = None, json: object = None) -> Any:
        give_up = time.monotonic() + self.deadline
        host, tried, delay = self._leader, 0, 0.02
        while True:
            try:
                answer = await self.http.call(method, f"{host}{path}", params=params, json=json)
                self._leader = host
                return answer
            except NotLeader as exc:
                hint = exc.details.get("leader")
                host = str(hint) if hint else self._next(host)
                last: Exception = exc
            except Unavailable as exc:
                host = self._next(host)
                last = exc
            tried += 1
            if time.monotonic() >= give_up:
                raise Unavailable(f"clustermgr {path}: no leader answered within {self.deadline}s: {last}")
            if tried % len(self.hosts) == 0:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _next(self, host: str) -> str:
        index = self.hosts.index(host) if host in self.hosts else -1
        return self.hosts[(index + 1) % len(self.hosts)]

    # disks

    async def alloc_disk_id(self) -> int:
        return int((await self.call("POST", "/disk/alloc_id"))["disk_id"])

    async def add_disk(self, disk: DiskInfo) -> DiskInfo:
        return DiskInfo.model_validate(await self.call("POST", "/disk/add", json=disk.model_dump()))

    async def disk_heartbeat(self, disks: list[dict[str, int]]) -> None:
        await self.call("POST", "/disk/heartbeat", json={"disks": disks})

    async def set_disk(self, disk_id: int, *, status: str | None = None, readonly: bool | None = None) -> DiskInfo:
        body: dict[str, Any] = {"disk_id": disk_id}
        if status is not None:
            body["status"] = status
        if readonly is not None:
            body["readonly"] = readonly
        return DiskInfo.model_validate(await self.call("POST", "/disk/set", json=body))

    async def get_disk(self, disk_id: int) -> DiskInfo:
        return DiskInfo.model_validate(await self.call("GET", "/disk/get", params={"disk_id": disk_id}))

    async def list_disks(self) -> list[dict[str, Any]]:
        """Each disk with `alive` (heartbeat within the timeout) added."""
        return list((await self.call("GET", "/disk/list"))["disks"])

    # volumes

    async def get_volume(self, vid: int) -> VolumeInfo:
        return VolumeInfo.model_validate(await self.call("GET", "/volume/get", params={"vid": vid}))

    async def list_volumes(self, status: str | None = None, code_mode: int | None = None) -> list[VolumeInfo]:
        params: dict[str, str | int] = {}
        if status:
            params["status"] = status
        if code_mode is not None:
            params["code_mode"] = code_mode
        raw = await self.call("GET", "/volume/list", params=params)
        return [VolumeInfo.model_validate(v) for v in raw["volumes"]]

    async def alloc_volumes(self, code_mode: int, holder: str, count: int = 1) -> list[VolumeInfo]:
        raw = await self.call("POST", "/volume/alloc", json={"code_mode": code_mode, "holder": holder, "count": count})
        return [VolumeInfo.model_validate(v) for v in raw["volumes"]]

    async def retain_volumes(self, holder: str, volumes: list[dict[str, int]]) -> dict[str, Any]:
        return dict(await self.call("POST", "/volume/retain", json={"holder": holder, "volumes": volumes}))

    async def release_volume(self, vid: int, holder: str) -> VolumeInfo:
        raw = await self.call("POST", "/volume/release", json={"vid": vid, "holder": holder})
        return VolumeInfo.model_validate(raw)

    async def lock_volume(self, vid: int) -> VolumeInfo:
        return VolumeInfo.model_validate(await self.call("POST", "/volume/lock", json={"vid": vid}))

    async def unlock_volume(self, vid: int) -> VolumeInfo:
        return VolumeInfo.model_validate(await self.call("POST", "/volume/unlock", json={"vid": vid}))

    async def alloc_unit(self, vid: int, index: int) -> Unit:
        return Unit.model_validate(await self.call("POST", "/volume/unit/alloc", json={"vid": vid, "index": index}))

    async def update_unit(self, vid: int, index: int, vuid: int, disk_id: int) -> VolumeInfo:
        body = {"vid": vid, "index": index, "vuid": vuid, "disk_id": disk_id}
        return VolumeInfo.model_validate(await self.call("POST", "/volume/unit/update", json=body))

    # scopes, services, config, kv

    async def alloc_scope(self, name: str, count: int) -> tuple[int, int]:
        raw = await self.call("POST", "/scope/alloc", json={"name": name, "count": count})
        return int(raw["start"]), int(raw["end"])

    async def register_service(self, name: str, host: str, idc: str = "", ttl: float = 30.0) -> None:
        await self.call("POST", "/service/register", json={"name": name, "host": host, "idc": idc, "ttl": ttl})

    async def service_heartbeat(self, name: str, host: str) -> None:
        await self.call("POST", "/service/heartbeat", json={"name": name, "host": host})

    async def list_services(self, name: str | None = None, alive_only: bool = True) -> list[ServiceInfo]:
        params: dict[str, str | int] = {"alive_only": int(alive_only)}
        if name:
            params["name"] = name
        raw = await self.call("GET", "/service/list", params=params)
        return [ServiceInfo.model_validate(s) for s in raw["services"]]

    async def get_config(self, key: str) -> str | None:
        return (await self.call("GET", "/config/get", params={"key": key}))["value"]

    async def set_config(self, key: str, value: str) -> None:
        await self.call("POST", "/config/set", json={"key": key, "value": value})

    async def list_config(self) -> dict[str, str]:
        return dict((await self.call("GET", "/config/list"))["config"])

    async def kv_get(self, key: str) -> str | None:
        return (await self.call("GET", "/kv/get", params={"key": key}))["value"]

    async def kv_set(self, key: str, value: str) -> None:
        await self.call("POST", "/kv/set", json={"key": key, "value": value})

    async def kv_cas(self, key: str, expected: str | None, value: str | None) -> None:
        """Raises `Conflict` when the current value is not `expected`."""
        await self.call("POST", "/kv/cas", json={"key": key, "expected": expected, "value": value})

    async def kv_delete(self, key: str) -> None:
        await self.call("POST", "/kv/delete", json={"key": key})

    async def kv_list(self, prefix: str = "") -> dict[str, str]:
        return dict((await self.call("GET", "/kv/list", params={"prefix": prefix}))["items"])

    # raft

    async def raft_status(self, host: str | None = None) -> dict[str, Any]:
        """The status of one replica (any host), or of the leader."""
        if host is not None:
            return dict(await self.http.call("GET", f"{host.rstrip('/')}/raft/status"))
        return dict(await self.call("GET", "/raft/status"))

    async def add_member(self, node_id: int, raft_addr: str, http_addr: str, learner: bool = True) -> dict[str, Any]:
        body = {"node_id": node_id, "raft_addr": raft_addr, "http_addr": http_addr, "learner": learner}
        return dict(await self.call("POST", "/raft/member/add", json=body))

    async def remove_member(self, node_id: int) -> dict[str, Any]:
        return dict(await self.call("POST", "/raft/member/remove", json={"node_id": node_id}))

    async def stat(self) -> dict[str, Any]:
        return dict(await self.call("GET", "/stat"))


async def keep_registered(cluster: ClusterClient, name: str, host: str, idc: str = "", ttl: float = 10.0) -> None:
    """Register a service and heartbeat it every ttl/3 until cancelled (re-registering if forgotten)."""
    registered = False
    while True:
        try:
            if not registered:
                await cluster.register_service(name, host, idc, ttl)
                registered = True
            else:
                await cluster.service_heartbeat(name, host)
        except NotFound:
            registered = False
            continue
        except Unavailable:
            pass
        await asyncio.sleep(ttl / 3)
