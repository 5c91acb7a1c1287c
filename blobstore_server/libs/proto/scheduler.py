"""Background task records (CubeFS's MigrateTask), kept in clustermgr's kv under `task/<type>/<task id>`.

The scheduler writes them and moves them through the states below; the backlog report reads them. A task
is open until it reaches a final state; `mtime` and the done counters show whether it still moves.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, Field

from blobstore_server.libs.proto.body import RequestBody
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import MAX_LOST_PER_MOVE
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable

TASK_PREFIX = "task/"
# clustermgr config: seconds without a heartbeat after which the scheduler declares a disk broken and
# repairs it, or "off" (then only an operator, `blobstore disk set ID --status broken`, or the blobnode does).
BROKEN_AFTER_KEY = "disk_broken_after"
DEFAULT_BROKEN_AFTER = 600.0  # what production configs get unless they say otherwise
# A volume this many losses from losing blobs (or fewer) is repaired first, past the disks' background caps.
URGENT_MARGIN = 1


def parse_broken_after(value: str | None) -> float | None:
    """The `BROKEN_AFTER_KEY` setting in seconds, None when off; ValueError naming what is wrong."""
    if value is None or value == "off":
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{BROKEN_AFTER_KEY} must be a number of seconds or 'off', not {value!r}") from None
    if not seconds > 0:
        raise ValueError(f"{BROKEN_AFTER_KEY} must be positive, not {value!r}")
    return seconds


class TaskState(StrEnum):
    INITED = "inited"  # recorded, waiting to be prepared
    PREPARED = "prepared"  # destination allocated, waiting for (or held by) a worker
    WORK_COMPLETED = "work_completed"  # the worker is done; the volume's unit is being switched
    FINISHED = "finished"
    FINISHED_IN_ADVANCE = "finished_in_advance"  # nothing to do any more (the unit had moved already)


FINAL_STATES = frozenset({TaskState.FINISHED, TaskState.FINISHED_IN_ADVANCE})


class TaskRecord(BaseModel):
    task_id: str = Field(min_length=1)
    task_type: TaskType
    state: TaskState = TaskState.INITED
    disk_id: int = Field(ge=0, lt=2**32)  # the source disk
    vid: int = Field(ge=0, lt=2**32)
    unit_index: int = Field(ge=0, lt=256)
    source_vuid: int = Field(ge=0, lt=2**64)
    source_host: str = ""  # the blobnode of the source disk
    target_disk: int | None = Field(None, ge=1, lt=2**32)  # the destination disk an operator asked for
    destination: Unit | None = None  # the unit being moved in, once prepared
    avoid_disks: list[int] = Field(default_factory=list)  # destinations that failed: never chosen again
    redo: int = Field(0, ge=0)  # destinations given up on so far
    worker: str = ""  # the last worker handed the task
    # Hand-outs so far: each takes the next token, saved before the destination's task fence is opened at it and
    # before the worker hears of it, so a worker handed the task earlier holds a token the destination refuses.
    token: int = Field(0, ge=0)
    reason: str = ""  # why it finished in advance, or what the last failure was
    ctime: float = Field(ge=0)
    mtime: float = Field(ge=0)  # the last change of state or progress
    done_bytes: int = Field(0, ge=0)
    done_shards: int = Field(0, ge=0)
    total_bytes: int = Field(0, ge=0)
    total_shards: int = Field(0, ge=0)
    lost_bids: list[int] = Field(default_factory=list, max_length=MAX_LOST_PER_MOVE)  # the last report's

    @property
    def key(self) -> str:
        return task_key(self.task_type, self.task_id)

    @property
    def open(self) -> bool:
        return self.state not in FINAL_STATES

    @property
    def source(self) -> Unit:
        return Unit(vuid=self.source_vuid, disk_id=self.disk_id, host=self.source_host)


def task_key(task_type: TaskType, task_id: str) -> str:
    return f"{TASK_PREFIX}{task_type}/{task_id}"


# The worker task protocol (scheduler API). Every call after acquire names the task's source and
# destination units and the hand-out's token; the scheduler refuses (409 Conflict) a call whose units, token or
# lease no longer match, so a worker that lost its task can never report progress for it or complete it. The
# worker's discards on the destination carry the token too, which the destination's blobnode checks.


class TaskRef(RequestBody):
    """What a worker holds: the task, the units it was handed and the token of the hand-out (fencing tokens)."""

    task_type: TaskType
    task_id: str = Field(min_length=1)
    worker: str = Field(min_length=1)  # the worker's id (host:port), the lease holder
    source_vuid: int = Field(ge=0, lt=2**64)
    destination_vuid: int = Field(ge=0, lt=2**64)
    epoch: int = Field(0, ge=0)  # of the scheduler lease it was handed out under: a newer holder refuses it
    token: int = Field(0, ge=0)  # of the hand-out (`TaskRecord.token`): a later hand-out supersedes it


class AcquireRequest(RequestBody):
    worker: str = Field(min_length=1)
    task_types: list[TaskType] = Field(default_factory=list)  # empty: any; disk repair is handed out first
    urgent_only: bool = False  # the worker's lane kept free for volumes one loss from losing blobs


class WorkTask(BaseModel):
    """A task handed to a worker: move unit `unit_index` of volume `vid` from `source` to `destination`
    (a chunk the scheduler already created, its task fence open at `ref.token`), rebuilding from the other
    units what `source` cannot give. `lease_ttl` seconds without a renew and the task goes back to the queue;
    the worker stops touching it well before (its own deadline, from its last renewal)."""

    ref: TaskRef
    vid: int = Field(ge=1, lt=2**32)
    unit_index: int = Field(ge=0, lt=256)
    source: Unit
    destination: Unit
    source_readable: bool  # False when the source disk is broken: every shard is rebuilt
    urgent: bool = False  # the volume is at margin <= 1: its I/O goes past the disks' background caps
    lease_ttl: float = Field(gt=0)
    done_bytes: int = Field(0, ge=0)  # already persisted progress (a reclaimed task resumes)
    done_shards: int = Field(0, ge=0)
    # the scheduler's ticket for discards on `destination` under `ref.token` (libs/rpc/tickets.py; None without auth)
    discard_ticket: str | None = Field(None, max_length=256)


class AcquireResult(BaseModel):
    task: WorkTask | None = None  # None: nothing to do now


class TaskProgress(RequestBody):
    ref: TaskRef
    done_bytes: int = Field(ge=0)
    done_shards: int = Field(ge=0)
    total_bytes: int = Field(ge=0)
    total_shards: int = Field(ge=0)
    # Blobs the worker found too few good shards of to rebuild: the switch names them, clustermgr checks each
    lost_bids: list[int] = Field(default_factory=list, max_length=MAX_LOST_PER_MOVE)


class TaskCancel(RequestBody):
    """The worker gives the task back; `destination_failed` makes the reclaim pick another destination."""

    ref: TaskRef
    reason: str
    destination_failed: bool = False


class TaskAck(BaseModel):
    task_id: str
    state: TaskState


class ManualMigrate(RequestBody):
    """Move unit `index` of volume `vid` to `disk_id`, or to a disk the placement policy picks."""

    vid: int = Field(ge=1, lt=2**32)
    index: int = Field(ge=0, lt=256)
    disk_id: int | None = Field(None, ge=1, lt=2**32)


class TaskList(BaseModel):
    tasks: list[TaskRecord]


class SchedulerStatus(BaseModel):
    host: str
    active: bool
    leader: str | None  # the active scheduler's URL as the lease record names it
    open_tasks: int
    leased_tasks: int


class LeaderRecord(BaseModel):
    """The election record in clustermgr's kv (`LEADER_KEY`): who is active, a counter bumped by each
    renewal, so a standby sees the record change while its holder lives, and the epoch, bumped by each
    takeover: the fencing token every state change of the holder carries (`libs.proto.clustermgr.Fence`)."""

    host: str
    term: int = Field(ge=1)
    epoch: int = Field(1, ge=1)


LEADER_KEY = "scheduler/leader"


class DiskProgress(BaseModel):
    """How far the evacuation of one disk (repair or drop) has come, from its task records."""

    disk_id: int
    tasks: int
    finished: int
    done_bytes: int
    total_bytes: int  # of the tasks a worker has sized so far (when it lists the unit)
    done_shards: int
    total_shards: int
    bytes_per_sec: float  # done bytes over the time since the first task was created
    eta_seconds: float | None  # None: nothing moved yet, or not every task sized


def disk_progress(records: Iterable[TaskRecord], disk_id: int, now: float) -> DiskProgress:
    tasks = [t for t in records if t.disk_id == disk_id]
    done = sum(t.done_bytes for t in tasks)
    total = sum(t.total_bytes for t in tasks)
    started = min((t.ctime for t in tasks), default=now)
    rate = done / (now - started) if now > started else 0.0
    unsized = any(t.open and not t.worker for t in tasks)  # no worker has listed its unit yet
    eta = (total - done) / rate if rate > 0 and not unsized else None
    return DiskProgress(disk_id=disk_id, tasks=len(tasks), finished=sum(not t.open for t in tasks), done_bytes=done,
                        total_bytes=total, done_shards=sum(t.done_shards for t in tasks),
                        total_shards=sum(t.total_shards for t in tasks), bytes_per_sec=rate, eta_seconds=eta)


class InspectStats(BaseModel):
    """Volume inspection since the scheduler started."""

    passes: int = 0  # complete rounds over every volume
    volumes: int = 0  # volumes whose units were all listed and compared
    repairs_queued: int = 0  # blobs with missing shards sent to the repair queue
    lost_blobs: int = 0  # blobs with fewer than N shards left


# Routes: each declared once, served by the app, called by the client, checked by auth (libs/rpc/routes.py).

TASK_ACQUIRE = Route("POST", "/task/acquire", C.TASKS, AcquireResult, AcquireRequest)
TASK_RENEW = Route("POST", "/task/renew", C.TASKS, TaskAck, TaskRef)
TASK_REPORT = Route("POST", "/task/report", C.TASKS, TaskAck, TaskProgress)
TASK_COMPLETE = Route("POST", "/task/complete", C.TASKS, TaskAck, TaskRef)
TASK_CANCEL = Route("POST", "/task/cancel", C.TASKS, TaskAck, TaskCancel)  # a worker giving its task back
TASK_MIGRATE = Route("POST", "/task/migrate", C.TASK_CONTROL, TaskRecord, ManualMigrate)
TASK_LIST = Route("GET", "/task/list", C.OBSERVE, TaskList)
STATUS = Route("GET", "/status", C.OBSERVE, SchedulerStatus)
ROUTES = RouteTable(TASK_ACQUIRE, TASK_RENEW, TASK_REPORT, TASK_COMPLETE, TASK_CANCEL, TASK_MIGRATE, TASK_LIST,
                    STATUS)
