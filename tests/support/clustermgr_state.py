"""Driving the clustermgr state machine with commands alone, as Raft would apply them (unit tests)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.cluster import Unit, VolumeInfo
from blobstore_server.libs.proto.clustermgr import DiskAdd
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.services.clustermgr.commands.disks import DiskAddCmd
from blobstore_server.services.clustermgr.commands.keys import ScopeAlloc
from blobstore_server.services.clustermgr.commands.table import Command, decode_result, encode
from blobstore_server.services.clustermgr.commands.volumes import VolumeCreate
from blobstore_server.services.clustermgr.machine import ClusterMachine
from blobstore_server.services.clustermgr.sessions import LoggedSession

R = Any


class AnyResult(BaseModel):
    model_config = ConfigDict(extra="allow")


class Driver:
    """Applies commands with consecutive indexes and decodes the answers."""

    def __init__(self, state: ClusterMachine) -> None:
        self.state = state
        self.index = state.applied_index()
        self.now = 1000.0

    def __call__(self, cmd: Command[R], session: LoggedSession | None = None) -> R:
        return self.raw(encode(cmd, self.now, session), cmd.result_type)

    def raw(self, command: bytes, result_type: type[BaseModel] = AnyResult) -> Any:
        self.index += 1
        return decode_result(self.state.apply(self.index, command), result_type)


def disk(disk_id: int, host: str, idc: str = "z0", rack: str = "r0") -> DiskAdd:
    return DiskAdd(disk_id=disk_id, host=host, idc=idc, rack=rack, path="/d", size=100, free=100)


def add_disks(cm: Driver, azs: int = 1, hosts: int = 6) -> None:
    cm(ScopeAlloc(name="disk_id", count=azs * hosts))
    disk_id = 0
    for a in range(azs):
        for h in range(hosts):
            disk_id += 1
            cm(DiskAddCmd(disk=disk(disk_id, f"http://h{a}-{h}", f"z{a}", f"r{h % 2}")))


def ec3p3_units(vid: int, first_disk: int = 1) -> list[Unit]:
    return [Unit(vuid=Vuid.make(vid, i, 1), disk_id=first_disk + i, host=f"http://h0-{i}") for i in range(6)]


def create_volume(cm: Driver, vid: int) -> VolumeInfo:
    return cm(VolumeCreate(vid=vid, code_mode=CodeMode.EC3P3, backend="isal", units=ec3p3_units(vid),
                           capacity=1 << 30))
