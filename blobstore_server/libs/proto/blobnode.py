"""The blobnode API: chunk and shard requests and answers, shared by its routes and its client.

Also the one classification of what a blobnode's answer says about a shard (`shard_state`), used by
access, the worker, tinker and the CLI alike.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from blobstore_server.libs.proto.body import RequestBody
from blobstore_server.libs.proto.messages import DeleteIntent
from blobstore_server.libs.proto.widths import U32, U64
from blobstore_server.libs.rpc.errors import (
    ChunkNotFound,
    DiskNotFound,
    RpcError,
    ShardCorrupted,
    ShardDeleted,
    ShardNotFound,
    StaleEpoch,
    Unavailable,
)
from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable

# A blobnode keeps the time of a delete mark in whole seconds: its delete hold counts from the end of that second,
# so a caller that times the hold itself (tinker) waits this much longer.
MARK_GRANULARITY = 1.0


class IOClass(StrEnum):
    """Who a shard request serves. A blobnode serves user I/O first and caps background I/O per disk (MB/s
    and concurrency), so repair, migration, inspection, compaction and deletes never starve user traffic."""

    USER = "user"
    BACKGROUND = "background"
    # Background work that cannot wait: rebuilding a volume at margin <= 1 (one more loss and blobs are gone).
    # It runs on the background threads but past the disk's background caps.
    URGENT = "urgent"


IO_CLASS_PARAM = "io_class"  # the query parameter that carries it; absent means user


class ChunkStatus(StrEnum):
    NORMAL = "normal"
    READONLY = "readonly"
    RELEASED = "released"


class TaskFence(StrEnum):
    """Which task token a chunk takes with a destructive call (`/shard/discard`): a task's destination is filled
    under the token of the hand-out that holds it, so a worker that lost its task can destroy nothing there."""

    NONE = "none"  # a volume's unit (clustermgr created it), never a task's destination: no token taken, ever
    READY = "ready"  # a scheduler created it for a task: no token taken until the task's hand-out opens it
    OPEN = "open"  # being filled by a task: only its current token (`task_token`) is taken, a call without none
    CLOSED = "closed"  # the task ended and the chunk is about to become (or is) a live unit: no token, ever again


class ChunkRef(RequestBody):
    disk_id: int = U32
    vuid: int = U64


class ChunkChange(ChunkRef):
    """A chunk state change (create, read-only, read-write, release). A scheduler sends the epoch of its lease:
    each disk keeps the highest it has seen and refuses an older one (`Fenced`), so a superseded scheduler
    changes no chunk of a disk its successor has addressed. None: not a scheduler's call (clustermgr creating a
    volume's chunks or rolling them back: Raft orders those, and they name units of a volume no scheduler moves).
    With an epoch, clustermgr's epoch ticket for it (libs/rpc/tickets.py), which a blobnode with auth requires."""

    scheduler_epoch: int | None = Field(None, ge=1)
    epoch_ticket: str | None = Field(None, max_length=256)


class ChunkCreate(ChunkChange):
    chunk_size: int | None = Field(None, ge=1 << 20)


class ChunkRelease(ChunkChange):
    """A release carries clustermgr's release ticket for this chunk (libs/rpc/tickets.py): a blobnode with auth
    refuses one without (403 ticket_refused), whoever signed the request."""

    ticket: str | None = Field(None, max_length=256)


class TaskFenceChange(ChunkRef):
    """Open the chunk's task fence at `token` (each hand-out of the task a larger one), or with None close it
    for good: the chunk is about to become a live unit. Only a scheduler sends it, under its lease's epoch."""

    scheduler_epoch: int = Field(ge=1)
    epoch_ticket: str | None = Field(None, max_length=256)
    token: int | None = Field(None, ge=1)


class ShardRef(ChunkRef):
    bid: int = U64


class ShardDelete(ShardRef):
    """A mark-delete and a delete for good carry tinker's delete ticket for this shard and access's intent for its
    blob (libs/rpc/tickets.py): a blobnode with auth refuses one without both (403 ticket_refused), whoever signed
    the request."""

    ticket: str | None = Field(None, max_length=256)
    intent: DeleteIntent | None = None


class ShardDiscard(ShardRef):
    """`task_token`: a task's worker filling the chunk sends the token of its hand-out (`TaskFence`), and `ticket`,
    the scheduler's discard ticket for that hand-out's destination (libs/rpc/tickets.py). Without a token, a
    blobnode with auth discards only a shard that fails its checksums (a repair's: it is lost already)."""

    task_token: int | None = Field(None, ge=1)
    ticket: str | None = Field(None, max_length=256)


class ChunkInfo(BaseModel):
    """A chunk's record (also how the blobnode keeps it in its RocksDB)."""

    chunk_id: str
    vuid: int
    status: ChunkStatus
    chunk_size: int
    created: float
    task_fence: TaskFence = TaskFence.NONE
    task_token: int = 0  # the last token the task fence was opened at (0: never)


class ChunkList(BaseModel):
    chunks: list[ChunkInfo]


class ChunkStat(ChunkInfo):
    disk_id: int
    shard_count: int
    live_bytes: int  # data sizes of indexed shards (mark-deleted included)
    physical_bytes: int  # their 4 KiB-aligned extents
    write_offset: int
    punched_bytes: int  # below write_offset, owned by no indexed shard
    disk_bytes: int  # what the file really occupies


class ShardInfo(BaseModel):
    bid: int
    vuid: int
    offset: int
    size: int
    crc: int
    status: str  # "normal" or "mark_deleted"


class ShardList(BaseModel):
    shards: list[ShardInfo]


class ShardPutResult(BaseModel):
    bid: int
    size: int
    crc: int


MAX_BATCH = 64  # shards in one `/shard/put_batch` or `/shard/get_batch` request
MAX_BATCH_BYTES = 4 << 20  # shard bytes in one `/shard/get_batch` answer
BATCH_SEPARATOR = "."  # between the values of one query parameter of a batch (never escaped in a URL)


class ShardFailure(BaseModel):
    """Why one shard of a batch was not stored: the typed error a single put would have answered."""

    status: int
    code: str
    error: str


class ShardPutOutcome(BaseModel):
    """One shard of a batch, in the request's order: `stored` or `failure`."""

    stored: ShardPutResult | None = None
    failure: ShardFailure | None = None


class ShardPutBatchResult(BaseModel):
    shards: list[ShardPutOutcome]


class ShardReadOutcome(BaseModel):
    """One range of a batched read, in the request's order: `length` bytes of it follow the head, or `failure`."""

    length: int = 0
    failure: ShardFailure | None = None


class ShardGetBatchHead(BaseModel):
    """What a batched read's answer begins with, as one line of JSON; each range's bytes follow, in order."""

    shards: list[ShardReadOutcome]


class ShardStatusResult(BaseModel):
    """After mark-delete, unmark or delete: the shard's status ("deleted" once gone for good)."""

    bid: int
    status: str


class ScrubStat(BaseModel):
    """A disk's scrub (services/blobnode/scrub.py): its current pass, its last full one, and what it found."""

    enabled: bool
    running: bool  # a pass is under way (else the next waits for its period)
    progress: float  # fraction of the current pass read (1.0 between passes, once one ended)
    pass_started: float  # unix time the current or last pass began; 0: none yet
    last_full_pass: float | None  # unix time the last full pass ended; None: none yet
    passes: int  # full passes, ever
    shards: int  # shards read, ever
    bytes: int
    corrupt: int  # shards found corrupt or unreadable, ever
    repairs_queued: int  # repairs mqproxy took for them
    repairs_owed: int  # findings mqproxy has not taken yet (kept, and sent again)
    rate: float = 0.0  # bytes per second the pass reads at: what it has left over what its period has left, capped
    # seconds past the end of its period the current (or next) pass ends even at scrub_mb_per_sec: the cap cannot
    # cover the disk's bytes in one period (0: on time)
    late_s: float = 0.0


class DiskStat(BaseModel):
    disk_id: int
    path: str
    size: int
    free: int
    used: int
    chunks: int
    max_chunks: int
    readonly_chunks: int
    scheduler_epoch: int = 0  # the highest scheduler lease epoch the disk has seen: chunk changes under older refused
    # chunk files in the disk's .trash/ (released or compacted away, kept trash_hold seconds), and what they occupy
    trash_files: int = 0
    trash_bytes: int = 0
    scrub: ScrubStat | None = None  # in a blobnode's /stat and /disk/stat


class NodeStat(BaseModel):
    host: str
    cluster_id: int
    idc: str
    rack: str
    disks: list[DiskStat]
    background_host: str = ""  # where the node's background reader serves background reads; "": the node itself


class ShardState(StrEnum):
    """What one blobnode answer says about a shard."""

    PRESENT = "present"
    MISSING = "missing"  # gone from its chunk: repair it
    CORRUPT = "corrupt"  # failed its CRC: repair it
    DELETED = "mark_deleted"  # the blob is being deleted: never repair it
    MOVED = "moved"  # the caller's view of the volume is stale: refetch the volume, then ask again
    UNREACHABLE = "unreachable"  # the blobnode is down or slow: says nothing about the shard
    ERROR = "error"


# A repair is owed for these; the others are not the shard's fault, or must not be repaired.
NEEDS_REPAIR = frozenset({ShardState.MISSING, ShardState.CORRUPT})
# The blobnode contradicts the caller's volume info (a newer epoch, no such chunk, or no such disk on that host:
# e.g. a stale or poisoned Redis entry naming the wrong host): refetch the volume from clustermgr, never punish
# the disk for it.
MOVED_ERRORS = (StaleEpoch, ChunkNotFound, DiskNotFound)


def shard_state(outcome: object) -> ShardState:
    """Classify a shard call's outcome: its result (present) or the error it raised."""
    if not isinstance(outcome, BaseException):
        return ShardState.PRESENT
    if isinstance(outcome, MOVED_ERRORS):
        return ShardState.MOVED
    if isinstance(outcome, ShardDeleted):
        return ShardState.DELETED
    if isinstance(outcome, ShardNotFound):
        return ShardState.MISSING
    if isinstance(outcome, ShardCorrupted):
        return ShardState.CORRUPT
    if isinstance(outcome, Unavailable):
        return ShardState.UNREACHABLE
    if isinstance(outcome, RpcError):
        return ShardState.ERROR
    return ShardState.UNREACHABLE


# the offline inspection's input: each disk's shard index and chunk list as Parquet, with a manifest


class ExportRequest(RequestBody):
    """Export every disk (or `disk_ids`) into `target`: an absolute path every Spark executor can read, or a
    filesystem URI pyarrow knows (file://, s3://, hdfs://, gs://)."""

    target: str = Field(min_length=1)
    disk_ids: list[int] | None = None
    piece_rows: int = Field(20_000, ge=100, le=1_000_000)  # index entries read per trip to the disk's pool


class S3Access(BaseModel):
    """One user of an S3 endpoint (path-style; the cluster's own gateway), for export targets of the form
    s3://bucket/prefix: the bucket of the inspection's exports and findings."""

    endpoint: str = Field(pattern=r"^https?://[^/?#]+$")
    access_key: str = Field(min_length=1)
    secret_key: str = Field(min_length=1)
    region: str = "us-east-1"
    ca_file: str | None = None  # where this machine has the CA an https endpoint is checked against; None: system's


class DiskExport(BaseModel):
    """A disk's manifest, written last: a disk without one (or with a broken one) is unavailable, not empty.
    Paths are relative to the export's target."""

    disk_id: int
    host: str
    started: float  # unix time the scan began; shards written later may or may not be in it
    finished: float
    shard_file: str
    shards: int
    chunk_file: str
    chunks: int


class ExportResult(BaseModel):
    exports: list[DiskExport]


# Routes: each declared once, served by the app, called by the client, checked by auth (libs/rpc/routes.py).

STAT = Route("GET", "/stat", C.OBSERVE, NodeStat)
DISK_STAT = Route("GET", "/disk/stat", C.OBSERVE, DiskStat)
CHUNK_CREATE = Route("POST", "/chunk/create", C.CHUNK, ChunkInfo, ChunkCreate)
CHUNK_RELEASE = Route("POST", "/chunk/release", C.CHUNK, ChunkInfo, ChunkRelease)
CHUNK_READONLY = Route("POST", "/chunk/readonly", C.CHUNK, ChunkInfo, ChunkChange)
CHUNK_READWRITE = Route("POST", "/chunk/readwrite", C.CHUNK, ChunkInfo, ChunkChange)
CHUNK_TASK_FENCE = Route("POST", "/chunk/fence", C.CHUNK, ChunkInfo, TaskFenceChange)
CHUNK_COMPACT = Route("POST", "/chunk/compact", C.CHUNK, ChunkInfo, ChunkRef)
CHUNK_LIST = Route("GET", "/chunk/list", C.READ_SHARD, ChunkList)
CHUNK_STAT = Route("GET", "/chunk/stat", C.READ_SHARD, ChunkStat)
SHARD_PUT = Route("PUT", "/shard/put", C.WRITE_SHARD, ShardPutResult, streamed=True)
# user shards for several units of one node: each query parameter lists one value per shard
# (BATCH_SEPARATOR), the body is their bytes one after another, every shard's CRC signed in the query
SHARD_PUT_BATCH = Route("PUT", "/shard/put_batch", C.WRITE_SHARD, ShardPutBatchResult, streamed=True)
SHARD_GET = Route[BaseModel]("GET", "/shard/get", C.READ_SHARD)  # answers the shard's bytes
# ranges of user shards on one node (query parameters as for SHARD_PUT_BATCH, `offset` and `size` each listed):
# answers a ShardGetBatchHead as a line of JSON, then the bytes of every range read
SHARD_GET_BATCH = Route[BaseModel]("GET", "/shard/get_batch", C.READ_SHARD)
SHARD_MARK_DELETE = Route("POST", "/shard/markdelete", C.WRITE_SHARD, ShardStatusResult, ShardDelete)
SHARD_UNMARK_DELETE = Route("POST", "/shard/unmarkdelete", C.WRITE_SHARD, ShardStatusResult, ShardRef)
SHARD_DELETE = Route("POST", "/shard/delete", C.DELETE_SHARD, ShardStatusResult, ShardDelete)
SHARD_DISCARD = Route("POST", "/shard/discard", C.DISCARD_SHARD, ShardStatusResult, ShardDiscard)
SHARD_STAT = Route("GET", "/shard/stat", C.READ_SHARD, ShardInfo)
SHARD_LIST = Route("GET", "/shard/list", C.READ_SHARD, ShardList)
INSPECT_EXPORT = Route("POST", "/inspect/export", C.EXPORT, ExportResult, ExportRequest)
ROUTES = RouteTable(STAT, DISK_STAT, CHUNK_CREATE, CHUNK_RELEASE, CHUNK_READONLY, CHUNK_READWRITE, CHUNK_TASK_FENCE,
                    CHUNK_COMPACT, CHUNK_LIST, CHUNK_STAT, SHARD_PUT, SHARD_PUT_BATCH, SHARD_GET, SHARD_GET_BATCH,
                    SHARD_MARK_DELETE, SHARD_UNMARK_DELETE, SHARD_DELETE, SHARD_DISCARD, SHARD_STAT, SHARD_LIST,
                    INSPECT_EXPORT)
