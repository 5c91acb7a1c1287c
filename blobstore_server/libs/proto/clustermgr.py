"""clustermgr's API: the request and response of every route, shared by its routes and its client.

The records these carry (disks, volumes, units, services) are in `libs.proto.cluster`; the code-mode
size policy, which clustermgr publishes and access reads, is here too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from blobstore_server.libs.ec import CodeMode, CodeModeName
from blobstore_server.libs.proto.body import RequestBody
from blobstore_server.libs.proto.cluster import (
    DiskInfo,
    DiskStatus,
    ServiceInfo,
    Unit,
    VolumeHealth,
    VolumeInfo,
    VolumeStatus,
)
from blobstore_server.libs.proto.widths import U32, U64
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.errors import BadRequest
from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable

DISK_ID = Field(ge=1, lt=2**32)
POLICY_KEY = "code_mode_policy"  # the config key of the size policy
SESSION_HEADER = auth.SESSION_HEADER  # carries a `Session` on every mutating request; signed with the request


# client sessions


class Fence(BaseModel):
    """The lease a command is sent under (Kleppmann's fencing token): clustermgr applies it only while the
    lease record at `key` (JSON with an `epoch`) still carries `epoch`; a holder superseded by a takeover gets
    `Fenced` back, however late its command arrives and whatever its own clock says."""

    key: str = Field(pattern=r"^\S{1,256}$")
    epoch: int = Field(ge=1)


def lease_epoch(record: str | None) -> int:
    """The epoch of a lease record in kv (0: none, or a record without one)."""
    if record is None:
        return 0
    try:
        epoch = json.loads(record).get("epoch", 0)
    except (ValueError, AttributeError):
        return 0
    return epoch if isinstance(epoch, int) else 0


class Session(BaseModel):
    """Which client sends a mutating command, and which of its commands it is (Raft thesis 6.3).

    clustermgr applies each (client, seq) once and answers a retry with the first answer, so a retry
    after a lost reply is safe. `acked`: every seq up to it has been answered or given up, so the
    client never retries those and clustermgr may forget their answers. Sent in `SESSION_HEADER` as
    "client seq acked [fence-key fence-epoch]"; a request without it is applied without this protection
    (e.g. from curl). A lease holder's commands carry its `Fence`.
    """

    client: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    seq: int = Field(ge=1, lt=2**63)
    acked: int = Field(ge=0)
    fence: Fence | None = None

    @model_validator(mode="after")
    def _acked_before_seq(self) -> Session:
        if self.acked >= self.seq:
            raise ValueError(f"acked {self.acked} must be below seq {self.seq}")
        return self

    def header(self) -> str:
        fence = f" {self.fence.key} {self.fence.epoch}" if self.fence else ""
        return f"{self.client} {self.seq} {self.acked}{fence}"

    @classmethod
    def parse(cls, raw: str) -> Session:
        """ValueError naming what is wrong."""
        parts = raw.split()
        if len(parts) not in (3, 5):
            raise ValueError(f"{SESSION_HEADER} must be 'client seq acked [fence-key fence-epoch]', got {raw!r}")
        try:
            fence = Fence(key=parts[3], epoch=int(parts[4])) if len(parts) == 5 else None
            return cls(client=parts[0], seq=int(parts[1]), acked=int(parts[2]), fence=fence)
        except ValueError as exc:  # a bad number, or pydantic's ValidationError
            raise ValueError(f"{SESSION_HEADER} {raw!r}: {exc}") from None


class LeaderView(BaseModel):
    """One replica's idea of who leads (cheap: no state read), for a client looking for the leader."""

    node_id: int
    role: str
    term: int
    leader: str | None  # the leader's HTTP base URL as this replica knows it; its own when it leads


# disks


class DiskAdd(RequestBody):
    disk_id: int = DISK_ID
    host: str
    idc: str
    rack: str
    path: str
    hostname: str = ""  # the machine's name (blobnode config `hostname`); "": its URL stands for it
    size: int = Field(0, ge=0)
    free: int = Field(0, ge=0)
    max_chunks: int = Field(1024, ge=0)


class DiskBeat(RequestBody):
    disk_id: int = DISK_ID
    size: int = Field(ge=0)
    free: int = Field(ge=0)
    chunks: int = Field(0, ge=0)
    trash_bytes: int = Field(0, ge=0)  # see DiskInfo
    scrub_late_s: float = Field(0.0, ge=0)


class DiskHeartbeat(RequestBody):
    disks: list[DiskBeat]


class DiskRef(RequestBody):
    disk_id: int = DISK_ID


class DiskSet(RequestBody):
    disk_id: int = DISK_ID
    status: DiskStatus | None = None
    readonly: bool | None = None


class DiskId(BaseModel):
    disk_id: int


class HeartbeatAnswer(BaseModel):
    """What a blobnode learns from an answered heartbeat, as the beat committed: each reported disk's status (one in
    `WRITE_FENCED` takes no shard write) and how long after sending the beat the node may take writes without
    another answered (`DiskInfo.write_fence_s`)."""

    statuses: dict[int, DiskStatus]
    write_fence_s: float


class DiskView(DiskInfo):
    """A disk as clustermgr reports it: with whether its blobnode heartbeats within the timeout."""

    alive: bool


class DiskList(BaseModel):
    disks: list[DiskView]


# volumes


class VolumeAlloc(RequestBody):
    code_mode: CodeMode
    holder: str = Field(min_length=1)
    count: int = Field(1, ge=1, le=1000)
    avoid_disks: list[int] = Field(default_factory=list, max_length=4096)  # lease volumes on these last
    # Also the volumes `holder` still leases: a restarted allocator (its name is its URL) takes back what its
    # previous run held instead of waiting for those leases to lapse. Only a holder that holds none yet asks.
    reclaim: bool = False
    # The largest blob the holder allocates (its writers' so far): a volume without room for one is not leased, and
    # clustermgr's floor counts only volumes with room for the largest any holder asked for
    largest_blob: int = Field(1, ge=1, le=1 << 40)


class VolumeView(VolumeInfo, VolumeHealth):
    """A volume as clustermgr reports it: with whether new blobs may go to it now, and why not."""


class VolumeList(BaseModel):
    volumes: list[VolumeView]
    # The Raft index the list reflects: a reader that keeps volumes asks with `since` set to it for what changed.
    revision: int = 0
    # An answer to a lease request: seconds each lease lasts from when clustermgr granted it, after the request
    # was sent. The holder counts that down on its own clock from when it sent the request: `lease_expiry` is on
    # clustermgr's wall clock, which no other host's clock may be compared with.
    lease_for: float = 0.0


class RetainItem(RequestBody):
    vid: int = U32
    used: int = Field(0, ge=0)


class VolumeRetain(RequestBody):
    holder: str = Field(min_length=1)
    volumes: list[RetainItem]


class Retained(VolumeHealth):
    """A renewed lease, with the volume's health as of the renewal."""

    vid: int
    lease_expiry: float


class Refused(BaseModel):
    vid: int
    reason: str


class RetainResult(BaseModel):
    retained: list[Retained]
    refused: list[Refused]
    lease_for: float  # seconds each renewed lease lasts from its renewal (see VolumeList.lease_for)


class VolumeRef(RequestBody):
    vid: int = U32


class VolumeHolder(VolumeRef):
    holder: str


class UnitRef(VolumeRef):
    index: int = Field(ge=0, lt=256)


class UnitAlloc(UnitRef):
    disk_id: int | None = Field(None, ge=1, lt=2**32)  # the target; None: the placement policy chooses
    avoid: list[int] = Field(default_factory=list, max_length=4096)  # disks the policy must not choose


# The most blobs one move may name lost: each is checked by reading its shards on every unit
MAX_LOST_PER_MOVE = 10_000


class UnitUpdate(UnitRef):
    """Commit the reserved move: clustermgr first checks that the destination holds every blob the unit owes, but
    those named `lost` (too few good shards anywhere to rebuild them) that it finds so itself (clustermgr/moves.py)."""

    vuid: int = U64
    disk_id: int = DISK_ID
    lost: list[int] = Field(default_factory=list, max_length=MAX_LOST_PER_MOVE)


class UnitRelease(VolumeRef):
    """May the chunk of unit `vuid` be released? Only if it is not the volume's live unit; if it is the unit
    reserved for a move, the reservation goes with it. With `disk_id` (the disk holding that chunk) the answer
    carries clustermgr's release ticket for it, which a blobnode with auth requires."""

    vuid: int = U64
    disk_id: int | None = Field(None, ge=1, lt=2**32)


class EpochAsk(RequestBody):
    """The ticket of scheduler lease epoch `epoch` (libs/rpc/tickets.py), answered only while the lease record in
    the kv holds that epoch."""

    epoch: int = Field(ge=1, lt=2**63)


class EpochTicket(BaseModel):
    epoch: int
    ticket: str | None = None  # None: this clustermgr runs without auth


class UnitReleased(VolumeInfo):
    """The volume after a unit release, and the release ticket of its chunk (None: no `disk_id` asked, or this
    clustermgr runs without auth)."""

    ticket: str | None = None


# scopes, services, config, kv


class ScopeAlloc(RequestBody):
    name: str = Field(min_length=1, max_length=64)
    count: int = Field(ge=1, le=1 << 32)


class ScopeRange(BaseModel):
    """Ids [start, end] of a scope, both ends included."""

    name: str
    start: int
    end: int


class ServiceRegister(RequestBody):
    name: str = Field(min_length=1)
    host: str = Field(min_length=1)
    idc: str = ""
    ttl: float = Field(30.0, gt=0)


class ServiceRef(RequestBody):
    name: str
    host: str


class ServiceList(BaseModel):
    services: list[ServiceInfo]


class KeyValue(RequestBody):
    key: str = Field(min_length=1)
    value: str


class KeyRef(RequestBody):
    key: str = Field(min_length=1)


class KeyCas(RequestBody):
    """Set `key` to `value` (None: delete it) only if it now holds `expected` (None: absent)."""

    key: str = Field(min_length=1)
    expected: str | None
    value: str | None


class MaybeValue(BaseModel):
    """A config or kv value; None when the key is not set."""

    key: str
    value: str | None


class ConfigList(BaseModel):
    config: dict[str, str]


class KvItems(BaseModel):
    items: dict[str, str]
    next_after: str | None = None  # the marker of the next page; None when this page was the last


KV_PAGE = 1000  # the most keys one /kv/list answers


# undelete records: tinker takes back every delete of a blob issued before the latest record covering it

UNDELETE_PREFIX = "undelete/"  # kv keys undelete/<vid>/<min_bid>, each an `UndeleteRecord`
# Seconds a delete may be stamped after an undelete (mqproxy's clock against clustermgr's) and still be taken back
# by it: the clock difference signatures already allow (auth.skew). A DELETE sent this soon after an undelete of
# the same object is taken back with the earlier ones.
UNDELETE_MARGIN = 5.0


def undelete_key(vid: int, min_bid: int) -> str:
    return f"{UNDELETE_PREFIX}{vid}/{min_bid}"


class UndeleteSlice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    vid: int = Field(ge=1, lt=2**32)
    min_bid: int = U64
    count: int = Field(ge=1, lt=2**32)


class Undelete(RequestBody):
    """Take back every delete of these blobs stamped before now (clustermgr's clock, give or take
    `UNDELETE_MARGIN`), queued or under way; the record is kept `keep` seconds, past which a delete message tinker
    had still not finished would be carried out after all."""

    slices: list[UndeleteSlice] = Field(min_length=1, max_length=4)  # a Location's (MAX_SLICES)
    keep: float = Field(gt=0)  # seconds


class UndeleteRecord(BaseModel):
    """The value of undelete/<vid>/<min_bid>: `count` blobs from min_bid, undeleted `at`, forgotten after `until`."""

    count: int = Field(ge=1)
    at: float
    until: float


class UndeleteTaken(BaseModel):
    """When an undelete took effect (clustermgr's clock): deletes stamped before it are taken back."""

    at: float


class Undeleted(BaseModel):
    """When each blob asked about was last undeleted (clustermgr's clock), in the order asked; None: no record of it
    is kept."""

    at: list[float | None]


MAX_UNDELETE_LOOKS = 256  # blobs one /undelete/get asks about


def undelete_looks(blobs: Sequence[tuple[int, int]]) -> dict[str, str]:
    """The query of an /undelete/get about `blobs` (vid, bid): both lists joined by "." (never escaped)."""
    return {"vids": ".".join(str(vid) for vid, _ in blobs), "bids": ".".join(str(bid) for _, bid in blobs)}


def parse_undelete_looks(vids: str, bids: str) -> list[tuple[int, int]]:
    """The blobs an /undelete/get asks about; BadRequest unless both lists hold as many integers (at most the max)."""
    vid_list, bid_list = vids.split("."), bids.split(".")
    if len(vid_list) != len(bid_list) or len(vid_list) > MAX_UNDELETE_LOOKS or not all(
            piece.isdigit() for piece in vid_list + bid_list):
        raise BadRequest(f"vids and bids must list as many integers, separated by '.', at most {MAX_UNDELETE_LOOKS}")
    return [(int(vid), int(bid)) for vid, bid in zip(vid_list, bid_list, strict=True)]


# raft


class MemberAdd(RequestBody):
    node_id: int = Field(ge=1)
    raft_addr: str
    http_addr: str
    learner: bool = True


class MemberRemove(RequestBody):
    node_id: int = Field(ge=1)


class RaftMember(BaseModel):
    addr: str
    voter: bool


class RaftStatus(BaseModel):
    id: int
    role: str
    term: int
    leader: int | None
    commit: int
    applied: int
    last_index: int
    snapshot_index: int
    members: dict[str, RaftMember]
    log_writes: int = 0  # synced writes to this replica's Raft log since it started


class ReplicaStatus(RaftStatus):
    """One replica's Raft status with its state machine's position and checksum."""

    node_id: int
    checksum: int
    applied_index: int


class DropReplies(RequestBody):
    """Fault hook (off unless clustermgr runs with `fault_hooks`): cut the next `count` successful
    replies on `path` after their command committed, as a connection lost at that moment would."""

    path: str = Field(pattern=r"^/")
    count: int = Field(1, ge=0)


class ClusterStat(BaseModel):
    disks: int
    volumes: int
    volumes_by_status: dict[VolumeStatus, int]
    sessions: int  # client sessions whose answers are remembered
    raft: RaftStatus


# the code-mode size policy


class CodeModeRule(BaseModel):
    """Keep at least `min_volumes` writable volumes of `code_mode`, `min_idle_volumes` of them (at most all) held
    by no live lease (an allocator whose peer died must find some to lease: the dead one's leases hold for the
    lease ttl); objects up to `max_size` bytes use it (the smallest matching max_size wins)."""

    code_mode: CodeModeName
    min_volumes: int = Field(2, ge=0)
    min_idle_volumes: int = Field(1, ge=0)
    max_size: int = Field(1 << 62, ge=0)
    enable: bool = True


_RULES = TypeAdapter(list[CodeModeRule])


class CodeModePolicy:
    """Object size -> code mode, from the rules clustermgr publishes under `POLICY_KEY`."""

    def __init__(self, rules: list[CodeModeRule], default: CodeMode) -> None:
        self.rules = rules
        self.default = default
        self._by_size = sorted(((r.max_size, r.code_mode) for r in rules if r.enable), key=lambda r: r[0])

    @staticmethod
    def parse(raw: str) -> list[CodeModeRule]:
        """The rules of a published policy; ValueError naming what is wrong."""
        try:
            return _RULES.validate_json(raw)
        except ValidationError as exc:
            raise ValueError(f"invalid {POLICY_KEY}: {exc}") from None

    @staticmethod
    def dump(rules: list[CodeModeRule]) -> str:
        return json.dumps([r.model_dump(mode="json") for r in rules])

    def mode_for(self, size: int) -> CodeMode:
        return next((mode for max_size, mode in self._by_size if size <= max_size), self.default)


# Routes: each declared once, served by the app, called by the client, checked by auth (libs/rpc/routes.py).

RAFT_STATUS = Route("GET", "/raft/status", C.OBSERVE, ReplicaStatus)
RAFT_LEADER = Route("GET", "/raft/leader", C.OBSERVE, LeaderView)
RAFT_MEMBER_ADD = Route("POST", "/raft/member/add", C.ADMIN, RaftStatus, MemberAdd)
RAFT_MEMBER_REMOVE = Route("POST", "/raft/member/remove", C.ADMIN, RaftStatus, MemberRemove)
DISK_ALLOC_ID = Route("POST", "/disk/alloc_id", C.DISK_REPORT, DiskId)
DISK_ADD = Route("POST", "/disk/add", C.DISK_REPORT, DiskInfo, DiskAdd)
DISK_HEARTBEAT = Route("POST", "/disk/heartbeat", C.DISK_REPORT, HeartbeatAnswer, DiskHeartbeat)
# The longest clustermgr holds a disk heartbeat to commit it with others (its `disk_heartbeat_batch`): a client
# waits this much longer for the answer than for any other, so a beat held on purpose is not taken for a dead
# replica (that cost every beat a timeout, a search for the leader on every replica and a second beat).
HEARTBEAT_HOLD_MAX = 2.0
DISK_SET = Route("POST", "/disk/set", C.DISK_STATUS, DiskInfo, DiskSet)
DISK_BROKEN = Route("POST", "/disk/broken", C.DISK_REPORT, DiskInfo, DiskRef)
DISK_GET = Route("GET", "/disk/get", C.OBSERVE, DiskView)
DISK_LIST = Route("GET", "/disk/list", C.OBSERVE, DiskList)
VOLUME_GET = Route("GET", "/volume/get", C.OBSERVE, VolumeView)
VOLUME_LIST = Route("GET", "/volume/list", C.OBSERVE, VolumeList)
VOLUME_ALLOC = Route("POST", "/volume/alloc", C.LEASE, VolumeList, VolumeAlloc)
VOLUME_RETAIN = Route("POST", "/volume/retain", C.LEASE, RetainResult, VolumeRetain)
VOLUME_RELEASE = Route("POST", "/volume/release", C.LEASE, VolumeInfo, VolumeHolder)
# A blobnode answered ChunkFull for one of the volume's shards: no room is left, whatever `used` says.
VOLUME_FULL = Route("POST", "/volume/full", C.LEASE, VolumeInfo, VolumeRef)
VOLUME_LOCK = Route("POST", "/volume/lock", C.UNITS, VolumeInfo, VolumeRef)
VOLUME_UNLOCK = Route("POST", "/volume/unlock", C.UNITS, VolumeInfo, VolumeRef)
UNIT_ALLOC = Route("POST", "/volume/unit/alloc", C.UNITS, Unit, UnitAlloc)
UNIT_RELEASE = Route("POST", "/volume/unit/release", C.UNITS, UnitReleased, UnitRelease)
UNIT_UPDATE = Route("POST", "/volume/unit/update", C.UNITS, VolumeInfo, UnitUpdate)
# A switch is answered after clustermgr listed every unit of the volume (about 4 s of its CPU per 200,000 bids):
# its caller waits this much longer for the answer than for any other
UNIT_CHECK_HOLD = 300.0
EPOCH_TICKET = Route("POST", "/scheduler/epoch", C.UNITS, EpochTicket, EpochAsk)
SCOPE_ALLOC = Route("POST", "/scope/alloc", C.LEASE, ScopeRange, ScopeAlloc)
SERVICE_REGISTER = Route("POST", "/service/register", C.REGISTER, ServiceInfo, ServiceRegister)
SERVICE_HEARTBEAT = Route("POST", "/service/heartbeat", C.REGISTER, ServiceInfo, ServiceRef)
SERVICE_UNREGISTER = Route("POST", "/service/unregister", C.REGISTER, ServiceRef, ServiceRef)
SERVICE_LIST = Route("GET", "/service/list", C.OBSERVE, ServiceList)
CONFIG_GET = Route("GET", "/config/get", C.OBSERVE, MaybeValue)
CONFIG_SET = Route("POST", "/config/set", C.ADMIN, KeyValue, KeyValue)
CONFIG_LIST = Route("GET", "/config/list", C.OBSERVE, ConfigList)
KV_GET = Route("GET", "/kv/get", C.OBSERVE, MaybeValue)
KV_SET = Route("POST", "/kv/set", C.KV, KeyValue, KeyValue)
KV_CAS = Route("POST", "/kv/cas", C.KV, MaybeValue, KeyCas)
KV_DELETE = Route("POST", "/kv/delete", C.KV, KeyRef, KeyRef)
KV_LIST = Route("GET", "/kv/list", C.OBSERVE, KvItems)
UNDELETE_ADD = Route("POST", "/undelete/add", C.CANCEL_DELETE, UndeleteTaken, Undelete)
UNDELETE_GET = Route("GET", "/undelete/get", C.OBSERVE, Undeleted)
STAT = Route("GET", "/stat", C.OBSERVE, ClusterStat)
DROP_REPLY = Route("POST", "/fault/drop_reply", C.ADMIN, DropReplies, DropReplies)
ROUTES = RouteTable(RAFT_STATUS, RAFT_LEADER, RAFT_MEMBER_ADD, RAFT_MEMBER_REMOVE, DISK_ALLOC_ID, DISK_ADD,
                    DISK_HEARTBEAT, DISK_SET, DISK_BROKEN, DISK_GET, DISK_LIST, VOLUME_GET, VOLUME_LIST, VOLUME_ALLOC,
                    VOLUME_RETAIN, VOLUME_RELEASE, VOLUME_FULL, VOLUME_LOCK, VOLUME_UNLOCK, UNIT_ALLOC, UNIT_RELEASE,
                    UNIT_UPDATE, EPOCH_TICKET, SCOPE_ALLOC, SERVICE_REGISTER, SERVICE_HEARTBEAT, SERVICE_UNREGISTER,
                    SERVICE_LIST, CONFIG_GET, CONFIG_SET, CONFIG_LIST, KV_GET, KV_SET, KV_CAS, KV_DELETE, KV_LIST,
                    UNDELETE_ADD, UNDELETE_GET, STAT, DROP_REPLY)
