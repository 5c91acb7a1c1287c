"""Every internal route's declaration, made once in its service's API module (libs/proto): method, path, the
capability it takes, its body and its answer. The service's app serves it, the service's client calls it, and
auth reads which capability it takes from the same object: each service hands its `RouteTable` to the server it
runs and to its client, so this package knows no service's routes itself."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

Answer = TypeVar("Answer", bound=BaseModel)


class Capability(StrEnum):
    READ_SHARD = "read-shard"  # read and list shards and chunks (also what an inspection grant carries)
    WRITE_SHARD = "write-shard"  # store a shard, mark or unmark it deleted
    DELETE_SHARD = "delete-shard"  # remove a shard marked deleted at least the blobnode's delete_hold ago (tinker)
    DISCARD_SHARD = "discard-shard"  # remove a shard at once to write the right bytes in its place (repair)
    CHUNK = "chunk"  # create, seal, release and compact chunks
    EXPORT = "export"  # a blobnode writing its index for the inspection
    OBSERVE = "observe"  # read cluster state: disks, volumes, services, config, kv, tasks, stats
    REGISTER = "register"  # a service announcing itself
    DISK_REPORT = "disk-report"  # a blobnode adding, heartbeating or failing its own disks (identity-bound)
    DISK_STATUS = "disk-status"  # marking any disk broken, repaired or read-only (operator, scheduler)
    ALLOCATE = "allocate"  # taking space and bids from an allocator (access)
    LEASE = "lease"  # leasing volumes and bid ranges from clustermgr under the caller's own name (identity-bound)
    UNITS = "units"  # locking volumes and moving their units (scheduler)
    KV = "kv"  # writing clustermgr's kv: the scheduler's lease and task records
    TASKS = "tasks"  # taking and reporting background tasks (worker)
    TASK_CONTROL = "task-control"  # an operator migrating a unit by hand (scheduler route)
    QUEUE_REPAIR = "queue-repair"  # queueing shard repairs through mqproxy
    QUEUE_DELETE = "queue-delete"  # queueing blob deletes through mqproxy (access only)
    UNDELETE = "undelete"  # taking a DELETE back through access (the operator; an SDK user by grant)
    CANCEL_DELETE = "cancel-delete"  # recording an undelete in clustermgr, which tinker obeys (access only)
    REPAIR = "repair"  # asking a worker to repair a shard now (tinker)
    ADMIN = "admin"  # an operator changing the cluster: config, Raft membership, fault injection
    RAFT_MEMBER = "raft-member"  # the Raft transport between clustermgr replicas (not an HTTP route)


@dataclass(frozen=True)
class Route(Generic[Answer]):
    """One route: `answer` is the model of its JSON answer (None: bytes, as a shard read answers), `body` the
    model its JSON body holds (None: none, or bytes), `streamed` a shard body signed by length and CRC."""

    method: str
    path: str
    capability: Capability
    answer: type[Answer] | None = None
    body: type[BaseModel] | None = None
    streamed: bool = False


class RouteTable:
    """Some routes (a service's, or several services'), as auth reads them: the capability each path takes and
    which paths carry a streamed body. One path may be declared by several services (`/stat`), always with the
    same capability; ValueError otherwise."""

    def __init__(self, *routes: Route[Any]) -> None:
        self.routes = routes
        capabilities: dict[str, Capability] = {}
        for route in routes:
            if capabilities.setdefault(route.path, route.capability) is not route.capability:
                raise ValueError(f"{route.path} is declared with both {capabilities[route.path]} and "
                                 f"{route.capability}")
        self.capabilities: Mapping[str, Capability] = MappingProxyType(capabilities)
        self.streamed = frozenset(route.path for route in routes if route.streamed)  # signed by length and CRC

    def __iter__(self) -> Iterator[Route[Any]]:
        return iter(self.routes)


NO_ROUTES = RouteTable()  # calls to no declared route: every path but the open ones takes `admin`
