"""The allocator API: space and bids for one object, shared by its routes and its client (access)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.body import RequestBody
from blobstore_server.libs.proto.cluster import VolumeHealth
from blobstore_server.libs.proto.location import MAX_BLOB_SIZE, MAX_OBJECT_SIZE
from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable

MAX_EXCLUDED = 4096
MAX_RESERVED_BIDS = 65536


class UnusedSpace(BaseModel):
    """Bytes and bids of volume `vid` an earlier allocation reserved and no object used."""

    vid: int = Field(ge=0)
    size: int = Field(ge=0, le=MAX_OBJECT_SIZE)
    bids: int = Field(0, ge=0, le=MAX_RESERVED_BIDS)  # 0 from an access node that does not say: none refunded


class AllocRequest(RequestBody):
    code_mode: CodeMode
    size: int = Field(ge=0, le=MAX_OBJECT_SIZE)
    blob_size: int = Field(4 << 20, ge=1, le=MAX_BLOB_SIZE)
    # What access punished: never these volumes, and these disks' volumes only when nothing else has room.
    exclude_vids: list[int] = Field(default_factory=list, max_length=MAX_EXCLUDED)
    avoid_disks: list[int] = Field(default_factory=list, max_length=MAX_EXCLUDED)
    # Consecutive bids wanted, when more than one per blob of `size`: access reserves bids and bytes for
    # the small objects to come, and gives back what they did not use in `returned`.
    bids: int | None = Field(None, ge=1, le=MAX_RESERVED_BIDS)
    returned: list[UnusedSpace] = Field(default_factory=list, max_length=MAX_EXCLUDED)
    # Volumes a blobnode answered ChunkFull for since access's last request: retired from allocation everywhere.
    full_vids: list[int] = Field(default_factory=list, max_length=MAX_EXCLUDED)


class BlobSlice(BaseModel):
    """`count` consecutive bids from `min_bid`, all in volume `vid`, to be written within `usable_for` seconds:
    until the allocator's lease on the volume ends, less its lease margin. A duration, not a time: the allocator
    counts it on its own clock from when it asked clustermgr for the lease, access counts it down on its own from
    when it sent the request, and no two hosts' clocks are ever compared."""

    vid: int
    min_bid: int
    count: int
    usable_for: float = 0.0


class AllocResult(BaseModel):
    code_mode: CodeMode
    blobs: list[BlobSlice]


class LeasedVolume(VolumeHealth):
    """A volume the allocator holds a lease on, with the space it has handed out (bytes on one unit, as its
    capacity: libs/space.py), where its units are, and its health as clustermgr last reported it."""

    vid: int
    code_mode: CodeMode
    capacity: int
    used: int
    lease_until: float  # on the holding allocator's monotonic clock, as its /stat's `now`
    disks: list[int] = Field(default_factory=list)  # of each unit, in unit order
    hosts: list[str] = Field(default_factory=list)
    under_spread: bool = False  # two units share a host

    @property
    def free(self) -> int:
        return self.capacity - self.used


class AllocatorStat(BaseModel):
    holder: str
    now: float  # the allocator's monotonic clock as it answered: a volume's `lease_until - now` is its lease left
    bids_left: int
    volumes: list[LeasedVolume]


# Routes: each declared once, served by the app, called by the client, checked by auth (libs/rpc/routes.py).

ALLOC = Route("POST", "/alloc", C.ALLOCATE, AllocResult, AllocRequest)
STAT = Route("GET", "/stat", C.OBSERVE, AllocatorStat)
ROUTES = RouteTable(ALLOC, STAT)
