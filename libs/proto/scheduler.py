"""Background task records (CubeFS's MigrateTask), kept in clustermgr's kv under `task/<type>/<task id>`.

The scheduler writes them and moves them through the states below; the backlog report reads them. A task
is open until it reaches a final state; `mtime` and the done counters show whether it still moves.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

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
