"""Service commands: the registry of running services and their heartbeats."""

from __future__ import annotations

from blobstore_server.libs.kv import Batch
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.cluster import ServiceInfo
from blobstore_server.libs.proto.clustermgr import ServiceRef
from blobstore_server.services.clustermgr.commands.table import Command, command
from blobstore_server.services.clustermgr.state import ClusterState


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
