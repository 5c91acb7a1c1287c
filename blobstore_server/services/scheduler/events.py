"""What the scheduler's state machine (`state.SchedulerState`) is told and what it answers, after dask's worker
state machine. Events are facts: a worker's call, what was read of clustermgr, the outcome of an action; each
brings the clocks at which it happened. Actions are what the I/O class (`scheduler.Scheduler`) carries out, in
order: the outcome of one is fed back as an event, and the actions that answers are carried out before the rest.
So the decisions can be driven, and checked, without processes or clocks: `drive` is that loop, given what
carries out the calls."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from blobstore_server.libs.proto.cluster import DiskStatus, Unit, VolumeInfo
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.scheduler import (
    AcquireRequest,
    AcquireResult,
    LeaderRecord,
    ManualMigrate,
    TaskCancel,
    TaskProgress,
    TaskRecord,
    TaskRef,
)
from blobstore_server.libs.rpc.errors import Conflict, Fenced, RpcError
from blobstore_server.services.scheduler.election import Claim

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Instant:
    now: float  # wall clock: task records' times
    mono: float  # monotonic: leases, hold-backs, silence


@dataclass(frozen=True, kw_only=True)
class Event:
    at: Instant

    @property
    def now(self) -> float:
        return self.at.now

    @property
    def mono(self) -> float:
        return self.at.mono


class Step(StrEnum):
    """Where a load or a round goes on once the actions before it are done (`Resume`)."""

    LOADED = "loaded"
    DISK = "disk"  # one disk's status, after its tasks were created
    BALANCE = "balance"
    GIVE_BACK = "give_back"
    PREPARE = "prepare"
    FINISH = "finish"
    PRUNE = "prune"


# leadership


@dataclass(frozen=True, kw_only=True)
class LeaderSeen(Event):
    """The election record as read (None: none yet); `at` is when the read began."""

    record: LeaderRecord | None


@dataclass(frozen=True, kw_only=True)
class LeaseGranted(Event):
    """The claim, sent at `started` (monotonic), committed."""

    claim: Claim
    started: float


@dataclass(frozen=True, kw_only=True)
class LeaseLost(Event):
    """The claim was refused: another instance changed the record first."""


@dataclass(frozen=True, kw_only=True)
class CampaignPassed(Event):
    """One pass of the campaign ended, whatever it read or wrote."""


@dataclass(frozen=True, kw_only=True)
class Superseded(Event):
    """clustermgr or a blobnode refused a change of this instance as fenced: a newer epoch holds the lease."""

    reason: str


# what was read


@dataclass(frozen=True, kw_only=True)
class TasksLoaded(Event):
    tasks: Sequence[TaskRecord]
    disks: Sequence[DiskView]


@dataclass(frozen=True, kw_only=True)
class ConfigSeen(Event):
    config: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class ClusterSeen(Event):
    disks: Sequence[DiskView]
    volumes: Mapping[int, VolumeInfo]


@dataclass(frozen=True, kw_only=True)
class Tick(Event):
    """A round is due: disks watched, tasks created, prepared, finished and pruned."""


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    step: Step
    disk_id: int = 0


# outcomes of actions


@dataclass(frozen=True, kw_only=True)
class TaskCreated(Event):
    """The record as written, or as an earlier holder wrote it."""

    task: TaskRecord


@dataclass(frozen=True, kw_only=True)
class TaskPersisted(Event):
    task: TaskRecord


@dataclass(frozen=True, kw_only=True)
class TaskDeleted(Event):
    task_id: str


@dataclass(frozen=True, kw_only=True)
class VolumeLocked(Event):
    task: TaskRecord
    error: RpcError | None


@dataclass(frozen=True, kw_only=True)
class SealResult(Event):
    """Whether the source chunk of a task being prepared takes no write any more."""

    task: TaskRecord
    sealed: bool


@dataclass(frozen=True, kw_only=True)
class UnitAllocated(Event):
    task: TaskRecord
    destination: Unit | None
    error: RpcError | None


@dataclass(frozen=True, kw_only=True)
class ChunkCreated(Event):
    task: TaskRecord
    destination: Unit
    error: RpcError | None


@dataclass(frozen=True, kw_only=True)
class FenceSet(Event):
    """The destination's task fence opened at `token` (a hand-out) or closed (None: before the switch)."""

    task: TaskRecord
    token: int | None
    error: RpcError | None


@dataclass(frozen=True, kw_only=True)
class UnitSeen(Event):
    """The vuid the task's unit has in its volume now, read to finish the task or for a worker's `cancel`."""

    task: TaskRecord
    vuid: int
    cancel: TaskCancel | None


@dataclass(frozen=True, kw_only=True)
class UnitSwitched(Event):
    task: TaskRecord
    refused: Conflict | None


# the worker protocol and the operator


@dataclass(frozen=True, kw_only=True)
class WorkerAcquire(Event):
    request: AcquireRequest


@dataclass(frozen=True, kw_only=True)
class WorkerHeartbeat(Event):
    ref: TaskRef


@dataclass(frozen=True, kw_only=True)
class TaskReported(Event):
    progress: TaskProgress


@dataclass(frozen=True, kw_only=True)
class TaskCompleted(Event):
    ref: TaskRef


@dataclass(frozen=True, kw_only=True)
class TaskCancelled(Event):
    request: TaskCancel


@dataclass(frozen=True, kw_only=True)
class MigrateAsked(Event):
    request: ManualMigrate
    volume: VolumeInfo


# actions


class Action:
    """Something to carry out; its outcome, if it has one, comes back as an event."""


@dataclass(frozen=True)
class ClaimLease(Action):
    """Swap the election record (answered by LeaseGranted or LeaseLost)."""

    claim: Claim
    started: float


@dataclass(frozen=True)
class FenceWith(Action):
    """Every later change this instance asks of clustermgr carries `epoch`."""

    epoch: int


@dataclass(frozen=True)
class CreateTask(Action):
    """Write a new record unless one exists (answered by TaskCreated with what is there)."""

    task: TaskRecord


@dataclass(frozen=True)
class PersistTask(Action):
    """Write the record through (answered by TaskPersisted): the table takes it only once it is written."""

    task: TaskRecord


@dataclass(frozen=True)
class DeleteTask(Action):
    task: TaskRecord


@dataclass(frozen=True)
class SetDiskStatus(Action):
    disk_id: int
    status: DiskStatus


@dataclass(frozen=True)
class LockVolume(Action):
    task: TaskRecord


@dataclass(frozen=True)
class SealSource(Action):
    """Make a source chunk read-only before its task is prepared (answered by SealResult)."""

    task: TaskRecord


@dataclass(frozen=True)
class SetSourcesReadonly(Action):
    """Best effort, all at once: the tasks' source chunks read-only (or writable again); no answer."""

    tasks: tuple[TaskRecord, ...]
    readonly: bool


@dataclass(frozen=True)
class AllocUnit(Action):
    task: TaskRecord


@dataclass(frozen=True)
class CreateChunk(Action):
    task: TaskRecord
    destination: Unit


@dataclass(frozen=True)
class SetTaskFence(Action):
    task: TaskRecord
    token: int | None


@dataclass(frozen=True)
class ReadUnit(Action):
    task: TaskRecord
    cancel: TaskCancel | None


@dataclass(frozen=True)
class SwitchUnit(Action):
    task: TaskRecord


@dataclass(frozen=True)
class ReleaseChunk(Action):
    """Best effort: a unit no volume has live any more, and its chunk."""

    host: str
    disk_id: int
    vuid: int


@dataclass(frozen=True)
class UnlockVolume(Action):
    vid: int


@dataclass(frozen=True)
class BestEffort(Action):
    """Carry out `first` and what follows from it; a failure (but Fenced) is logged after `failing`, for a later
    round to take up."""

    first: Action
    failing: str


@dataclass(frozen=True)
class Resume(Action):
    """Answered by Resumed: what comes next is decided on what the actions before it changed."""

    step: Step
    disk_id: int = 0


@dataclass(frozen=True)
class Answer(Action):
    """What the route that fed the event answers."""

    value: AcquireResult | TaskRecord


@dataclass(frozen=True)
class Refuse(Action):
    """The route's call is refused with `error`; nothing after it is carried out."""

    error: RpcError


class StaleEpoch(Fenced):
    """A worker's call about a task handed out under an older epoch: the caller is fenced (it reaches it as
    Fenced), not this scheduler, which stays the leader."""


@dataclass(frozen=True)
class Log(Action):
    """A line logged once the actions before it are done."""

    level: int
    text: str


Handle = Callable[[Event], list[Action]]
Perform = Callable[[Action], Awaitable[Event | None]]  # a call carried out: the event its outcome is, if awaited


async def drive(handle: Handle, event: Event, perform: Perform, clock: Callable[[], Instant]
                ) -> AcquireResult | TaskRecord | None:
    """Carry out what `handle` (the state) answers `event`: the route's answer, if any."""
    return await _carry_out(handle, handle(event), perform, clock)


async def _carry_out(handle: Handle, actions: list[Action], perform: Perform, clock: Callable[[], Instant]
                     ) -> AcquireResult | TaskRecord | None:
    """The actions in order, each outcome fed back to `handle` and the actions it answers carried out before the
    rest. A refusal is raised, as is a failed call: nothing after it is carried out. `perform` makes the calls;
    the actions that make none are carried out here."""
    answer = None
    pending = actions[::-1]
    while pending:
        action = pending.pop()
        outcome: Event | None = None
        match action:
            case Answer():
                answer = action.value
            case Refuse():
                raise action.error
            case Log():
                log.log(action.level, "%s", action.text)
            case Resume():
                outcome = Resumed(step=action.step, disk_id=action.disk_id, at=clock())
            case BestEffort():
                try:
                    await _carry_out(handle, [action.first], perform, clock)
                except Fenced:
                    raise
                except RpcError as exc:  # a later round takes it up
                    log.warning("%s: %s", action.failing, exc)
            case _:
                outcome = await perform(action)
        if outcome is not None:
            pending += handle(outcome)[::-1]
    return answer
