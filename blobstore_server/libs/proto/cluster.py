"""Cluster metadata records shared by clustermgr, its clients, the CLI and the background services."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from blobstore_server.libs.ec import CodeMode


class DiskStatus(StrEnum):
    NORMAL = "normal"
    BROKEN = "broken"
    REPAIRING = "repairing"
    REPAIRED = "repaired"
    DROPPING = "dropping"
    DROPPED = "dropped"


# Which status a disk may move to next; everything else is refused.
DISK_TRANSITIONS: dict[DiskStatus, frozenset[DiskStatus]] = {
    DiskStatus.NORMAL: frozenset({DiskStatus.BROKEN, DiskStatus.DROPPING}),
    DiskStatus.BROKEN: frozenset({DiskStatus.REPAIRING}),
    DiskStatus.REPAIRING: frozenset({DiskStatus.REPAIRED}),
    DiskStatus.REPAIRED: frozenset(),
    DiskStatus.DROPPING: frozenset({DiskStatus.DROPPED, DiskStatus.NORMAL}),
    DiskStatus.DROPPED: frozenset(),
}
# A disk in one of these takes no shard write: its units are rebuilt elsewhere, and a shard landing on it after the
# rebuild listed the units would never reach the new unit (dropping disks are sealed chunk by chunk instead).
WRITE_FENCED = frozenset({DiskStatus.BROKEN, DiskStatus.REPAIRING, DiskStatus.REPAIRED, DiskStatus.DROPPED})
# A blobnode takes shard writes only up to its write fence after sending a heartbeat that clustermgr answered.
WRITE_FENCE_MIN = 20.0  # a clustermgr leader change must not stop every node's writes
WRITE_FENCE_MAX = 300.0  # unattended repair off: an operator marks a silent disk broken


def write_fence_for(broken_after: float | None) -> float:
    """The write fence handed to blobnodes for a `disk_broken_after` (None: off): half of it, so a node cut off from
    clustermgr stops taking writes well before its disks are rebuilt elsewhere."""
    return WRITE_FENCE_MAX if broken_after is None else min(WRITE_FENCE_MAX, max(WRITE_FENCE_MIN, broken_after / 2))


class DiskInfo(BaseModel):
    disk_id: int = Field(ge=1, lt=2**32)
    host: str  # the blobnode's URL
    idc: str
    rack: str
    path: str
    hostname: str = ""  # the machine's name, which placement spreads units over; "": the URL (a host is a port)
    status: DiskStatus = DiskStatus.NORMAL
    readonly: bool = False
    size: int = Field(0, ge=0)
    free: int = Field(0, ge=0)
    max_chunks: int = Field(1024, ge=0)
    chunks: int = Field(0, ge=0)
    # bytes its blobnode holds in the disk's .trash/ (chunk files released or compacted away, kept trash_hold)
    trash_bytes: int = Field(0, ge=0)
    # seconds past the end of its scrub period the disk's current (or next) scrub pass ends even at the blobnode's
    # scrub_mb_per_sec: above 0, the cap cannot read the disk's bytes once per period
    scrub_late_s: float = Field(0.0, ge=0)
    last_heartbeat: float = 0.0
    # how long after its last committed heartbeat its blobnode may still take shard writes (the fence that beat's
    # answer gave, or a longer earlier one still open): silent this long, as anyone measures it, it takes none
    write_fence_s: float = Field(WRITE_FENCE_MAX, gt=0)

    @property
    def machine(self) -> str:
        """What two units of a volume should not share."""
        return self.hostname or self.host

    @property
    def writable(self) -> bool:
        return self.status is DiskStatus.NORMAL and not self.readonly and self.chunks < self.max_chunks

    def heard_from(self, now: float, heartbeat_timeout: float) -> bool:
        """Whether its blobnode heartbeated within the timeout."""
        return now - self.last_heartbeat <= heartbeat_timeout


class VolumeStatus(StrEnum):
    IDLE = "idle"
    ACTIVE = "active"
    LOCK = "lock"


class Unit(BaseModel):
    vuid: int = Field(ge=0, lt=2**64)
    disk_id: int = Field(ge=1, lt=2**32)
    host: str


class VolumeInfo(BaseModel):
    vid: int = Field(ge=1, lt=2**32)
    code_mode: CodeMode
    backend: str
    status: VolumeStatus = VolumeStatus.IDLE
    units: list[Unit]
    capacity: int = Field(ge=0)
    used: int = Field(0, ge=0)
    lease_holder: str = ""
    lease_expiry: float = 0.0
    pending_units: dict[int, Unit] = Field(default_factory=dict)  # unit index -> unit being moved in
    # unit index -> epoch of its latest reservation given up (released unused): never issued again
    dropped_epochs: dict[int, int] = Field(default_factory=dict)
    # Two units share a host: placed while too few live hosts existed for one unit each.
    under_spread: bool = False

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)


class VolumeHealth(BaseModel):
    """Whether new blobs may go to a volume now, as clustermgr judges it from its units' disks."""

    writable: bool = True
    why_not: str = ""  # empty when writable
    down_units: list[int] = Field(default_factory=list)  # unit indexes on a dead or out-of-service disk


class ServiceInfo(BaseModel):
    name: str
    host: str
    idc: str = ""
    last_heartbeat: float = 0.0
    ttl: float = Field(30.0, gt=0)

    def alive(self, now: float) -> bool:
        return now - self.last_heartbeat <= self.ttl
