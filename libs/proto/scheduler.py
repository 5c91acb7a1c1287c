"""Background task records (CubeFS's MigrateTask), kept in clustermgr's kv under `task/<type>/<task id>`.

The scheduler writes them and moves them through the states below; the backlog report reads them. A task
is open until it reaches a final state; `mtime` and the done counters show whether it still moves.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from libs.proto.cluster import Unit
from libs.proto.switches import TaskType

TASK_PREFIX = "task/"


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
    destination_vuid: int | None = Field(None, ge=0, lt=2**64)
    ctime: float = Field(ge=0)
    mtime: float = Field(ge=0)  # the last change of state or progress
    done_bytes: int = Field(0, ge=0)
    done_shards: int = Field(0, ge=0)
    total_bytes: int = Field(0, ge=0)
    total_shards: int = Field(0, ge=0)

    @property
    def key(self) -> str:
        return task_key(self.task_type, self.task_id)

    @property
    def open(self) -> bool:
        return self.state not in FINAL_STATES


def task_key(task_type: TaskType, task_id: str) -> str:
    return f"{TASK_PREFIX}{task_type}/{task_id}"


# The worker task protocol (scheduler API). Every call after acquire names the task's source and
# destination units; the scheduler refuses (409 Conflict) a call whose units or lease no longer match,
# so a worker that lost its task can never report progress for it or complete it.


class TaskRef(BaseModel):
    """What a worker holds: the task, and the units it was handed (the fencing token)."""

    task_type: TaskType
    task_id: str = Field(min_length=1)
    worker: str = Field(min_length=1)  # the worker's id (host:port), the lease holder
    source_vuid: int = Field(ge=0, lt=2**64)
    destination_vuid: int = Field(ge=0, lt=2**64)


class AcquireRequest(BaseModel):
    worker: str = Field(min_length=1)
    task_types: list[TaskType] = Field(default_factory=list)  # empty: any; disk repair is handed out first


class WorkTask(BaseModel):
    """A task handed to a worker: move unit `unit_index` of volume `vid` from `source` to `destination`
    (a chunk the scheduler already created), rebuilding from the other units what `source` cannot
    give. `lease_ttl` seconds without a renew and the task goes back to the queue."""

    ref: TaskRef
    vid: int = Field(ge=1, lt=2**32)
    unit_index: int = Field(ge=0, lt=256)
    source: Unit
    destination: Unit
    source_readable: bool  # False when the source disk is broken: every shard is rebuilt
    lease_ttl: float = Field(gt=0)
    done_bytes: int = Field(0, ge=0)  # already persisted progress (a reclaimed task resumes)
    done_shards: int = Field(0, ge=0)


class AcquireResult(BaseModel):
    task: WorkTask | None = None  # None: nothing to do now


class TaskProgress(BaseModel):
    ref: TaskRef
    done_bytes: int = Field(ge=0)
    done_shards: int = Field(ge=0)
    total_bytes: int = Field(ge=0)
    total_shards: int = Field(ge=0)


class TaskCancel(BaseModel):
    """The worker gives the task back; `destination_failed` makes the reclaim pick another destination."""

    ref: TaskRef
    reason: str
    destination_failed: bool = False


class TaskAck(BaseModel):
    task_id: str
    state: TaskState
