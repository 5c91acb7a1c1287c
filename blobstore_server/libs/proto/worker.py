"""The worker API: rebuild named shards of one blob."""

from __future__ import annotations

from pydantic import BaseModel, Field

from blobstore_server.libs.proto.body import RequestBody
from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable


class ShardRepair(RequestBody):
    vid: int = Field(ge=1, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)
    bad_indexes: list[int] = Field(min_length=1)


class RepairResult(BaseModel):
    vid: int
    bid: int
    repaired: list[int] = Field(default_factory=list)
    skipped: str = ""  # why nothing was written, when nothing needed to be or could be


class WorkerStats(BaseModel):
    repaired_shards: int = 0
    repaired_bytes: int = 0
    skipped: int = 0
    failed: int = 0


class MigrateStats(BaseModel):
    """Shards moved by unit migrations (disk repair, drop, balance, manual), since the worker started."""

    copied_shards: int = 0  # read from the old unit
    rebuilt_shards: int = 0  # decoded from the other units
    resumed_shards: int = 0  # already on the destination (a redone task)
    left_shards: int = 0  # never written: being deleted, or on no other unit
    lost_shards: int = 0  # never written: fewer than N shards of the blob exist anywhere (logged as LOST)
    written_bytes: int = 0
    lapsed_tasks: int = 0  # tasks given up unfinished: no renewal went through in time (the lease may have lapsed)
    fenced_tasks: int = 0  # tasks given up unfinished: the scheduler or the destination refused this worker's hold


# Routes: each declared once, served by the app, called by the client, checked by auth (libs/rpc/routes.py).

SHARD_REPAIR = Route("POST", "/shard/repair", C.REPAIR, RepairResult, ShardRepair)
STATS = Route("GET", "/stats", C.OBSERVE, WorkerStats)
ROUTES = RouteTable(SHARD_REPAIR, STATS)
