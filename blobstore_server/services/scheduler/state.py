"""The scheduler's state machine: the task table, the worker leases, the election and what this instance saw of
the cluster, and every decision on them (`rules.py` holds the pure rules it applies). `SchedulerState.handle`
takes one event (`events.py`) and answers the actions to carry out, in order; it does no I/O and reads no clock.

Only the elected instance works; the task records (`task/<type>/<id>`) are loaded when it takes over, and every
change is written through before the table takes it (`PersistTask`, then `TaskPersisted`). Worker leases live in
memory only; a takeover bumps the lease epoch, so workers holding tasks of the old one are refused and acquire
them again.

Fencing, besides clustermgr's check of the epoch on every change this instance asks of it: the chunk state
changes it sends to blobnodes carry the epoch too (each disk refuses an older one than it has seen), and on
taking over it seals again the source of every task past preparation, so a superseded instance that wakes up
cannot reopen one. A task is prepared only once its source takes no write (sealed, or its node's write fence
waited out). Each hand-out of a task takes a new token, saved, then set as the destination chunk's task fence
before the worker hears of it; the fence is closed before the unit is switched to the destination, so a worker
that lost the task can discard nothing on the destination, live or not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from blobstore_server.libs.proto.cluster import WRITE_FENCED, DiskInfo, DiskStatus, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.scheduler import (
    BROKEN_AFTER_KEY,
    AcquireResult,
    SchedulerStatus,
    TaskRecord,
    TaskRef,
    TaskState,
    WorkTask,
    parse_broken_after,
)
from blobstore_server.libs.proto.switches import Switches, TaskType, switch_states
from blobstore_server.libs.rpc.errors import Conflict, NotLeader
from blobstore_server.services.scheduler import rules
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.scheduler.election import Election
from blobstore_server.services.scheduler.events import (
    Action,
    AllocUnit,
    Answer,
    BestEffort,
    CampaignPassed,
    ChunkCreated,
    ClaimLease,
    ClusterSeen,
    ConfigSeen,
    CreateChunk,
    CreateTask,
    DeleteTask,
    Event,
    FenceSet,
    FenceWith,
    LeaderSeen,
    LeaseGranted,
    LeaseLost,
    LockVolume,
    Log,
    MigrateAsked,
    PersistTask,
    ReadUnit,
    Refuse,
    ReleaseChunk,
    Resume,
    Resumed,
    SealResult,
    SealSource,
    SetDiskStatus,
    SetSourcesReadonly,
    SetTaskFence,
    StaleEpoch,
    Step,
    Superseded,
    SwitchUnit,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskDeleted,
    TaskPersisted,
    TaskReported,
    TasksLoaded,
    Tick,
    UnitAllocated,
    UnitSeen,
    UnitSwitched,
    UnlockVolume,
    VolumeLocked,
    WorkerAcquire,
    WorkerHeartbeat,
)
from blobstore_server.services.scheduler.rules import EVACUATE, LOCKING, Lease, advance

log = logging.getLogger(__name__)
UNREADABLE = frozenset({DiskStatus.BROKEN, DiskStatus.REPAIRING, DiskStatus.REPAIRED})
SEALED = (TaskState.PREPARED, TaskState.WORK_COMPLETED)  # past preparation: the source must stay read-only
ROUND = (Step.BALANCE, Step.GIVE_BACK, Step.PREPARE, Step.FINISH, Step.PRUNE)  # after the disks, in order


class SchedulerState:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.me = config.advertised_host
        self.election = Election(self.me, config.election_ttl)
        self.epoch = 0  # of the lease this instance last won; its workers' task calls must carry it
        self.fenced = 0  # requests refused for a superseded epoch: its own by clustermgr, workers' by it
        self.switches = Switches()
        self.broken_after: float | None = None  # as the config last read says (`BROKEN_AFTER_KEY`)
        self.tasks: dict[str, TaskRecord] = {}
        self.leases: dict[str, Lease] = {}
        self.held_back: dict[str, float] = {}  # task id -> monotonic time before which it is not handed out
        self.disks: dict[int, DiskView] = {}
        self.volumes: Mapping[int, VolumeInfo] = {}
        self.placed: Mapping[int, Sequence[rules.Placed]] = {}
        self.margins: dict[int, int] = {}  # vid -> losses it can still take, for volumes with a lost unit
        self.silent: dict[int, tuple[float, float]] = {}  # disk -> (last heartbeat seen, monotonic since)
        self.fenced_since: dict[int, float] = {}  # disk -> monotonic time it was first seen in a WRITE_FENCED status
        self.loaded = False

    def handle(self, event: Event) -> list[Action]:
        """The actions `event` calls for, in order."""
        match event:
            case LeaderSeen():
                claim = self.election.decide(event.record, event.mono)
                return [] if claim is None else [ClaimLease(claim, event.mono)]
            case LeaseGranted():
                return self._lease_granted(event)
            case LeaseLost():
                self.election.lost()
            case CampaignPassed():
                if not self.active(event.mono) and self.loaded:
                    self._forget()
            case Superseded():
                self._superseded(event)
            case TasksLoaded():
                return self._tasks_loaded(event)
            case ConfigSeen():
                self._config_seen(event)
            case ClusterSeen():
                self._cluster_seen(event)
            case Tick():
                return self._tick(event)
            case Resumed():
                return self._resumed(event)
            case TaskCreated() | TaskPersisted() | TaskDeleted():
                self._recorded(event)
            case VolumeLocked() | SealResult() | UnitAllocated() | ChunkCreated():
                return self._preparing(event)
            case FenceSet():
                return self._fence_set(event)
            case UnitSeen():
                return self._finish(event) if event.cancel is None else self._cancel(event)
            case UnitSwitched():
                return self._switched(event)
            case WorkerAcquire() | WorkerHeartbeat() | TaskReported() | TaskCompleted() | TaskCancelled():
                return self._worker_call(event)
            case MigrateAsked():
                return self._migrate(event)
            case _:
                raise TypeError(f"no handler for {event!r}")
        return []

    # leadership

    def active(self, mono: float) -> bool:
        return self.election.active(mono)

    def standby_refusal(self, mono: float) -> NotLeader | None:
        """What a call to a standby is answered, naming the leader; None while active."""
        if self.active(mono):
            return None
        return NotLeader(f"{self.me} is not the active scheduler", leader=self.election.leader or "")

    def _lease_granted(self, event: LeaseGranted) -> list[Action]:
        actions: list[Action] = []
        if event.claim.record.epoch != self.epoch:
            log.warning("%s is now the active scheduler (epoch %d)", self.me, event.claim.record.epoch)
            self.epoch = event.claim.record.epoch
            actions.append(FenceWith(self.epoch))
        self.election.won(event.claim, event.started)
        return actions

    def _superseded(self, event: Superseded) -> None:
        """clustermgr refused a change: a newer scheduler holds the lease. Stand by at once, whatever the clock
        says (a pause or a partition outlasted the lease); counted once per lease lost."""
        if not self.loaded:
            return
        self.fenced += 1
        log.warning("%s was superseded (epoch %d): %s", self.me, self.epoch, event.reason)
        self.election.lost()
        self._forget()

    def _forget(self) -> None:
        """Standing by: another instance owns the tasks now."""
        log.warning("%s stands by", self.me)
        self.tasks.clear()
        self.leases.clear()
        self.held_back.clear()
        self.margins.clear()
        self.loaded = False

    def _tasks_loaded(self, event: TasksLoaded) -> list[Action]:
        """The records as the last holder left them. The sources this instance relies on staying sealed learn its
        epoch before it hands any task out: a superseded instance can no longer reopen them."""
        self.tasks = {task.task_id: task for task in event.tasks}
        self.disks = {d.disk_id: d for d in event.disks}
        sealed = tuple(t for t in self.tasks.values() if t.state in SEALED and self._heard_from(t.disk_id, event.mono))
        return [*([SetSourcesReadonly(sealed, True)] if sealed else []), Resume(Step.LOADED)]

    # what was read

    def _config_seen(self, event: ConfigSeen) -> None:
        self.switches.update(switch_states(event.config))
        try:
            self.broken_after = parse_broken_after(event.config.get(BROKEN_AFTER_KEY))
        except ValueError as exc:
            log.warning("ignoring config: %s", exc)
            self.broken_after = None

    def _cluster_seen(self, event: ClusterSeen) -> None:
        self.disks = {d.disk_id: d for d in event.disks}
        self.volumes = event.volumes
        for disk in event.disks:
            if disk.status in WRITE_FENCED:
                self.fenced_since.setdefault(disk.disk_id, event.mono)
            else:
                self.fenced_since.pop(disk.disk_id, None)
        lost = {d.disk_id for d in event.disks
                if d.status in UNREADABLE or self._silent_for(d, event.mono) > self.config.disk_lost_after}
        self.margins = rules.volume_margins(event.volumes.values(), lost)
        self.placed = rules.units_by_disk(event.volumes.values())

    def _heard_from(self, disk_id: int, mono: float) -> bool:
        """Whether the disk's node beat within `disk_lost_after`, as this scheduler saw it: worth a call."""
        disk = self.disks.get(disk_id)
        return disk is not None and self._silent_for(disk, mono) <= self.config.disk_lost_after

    def _silent_for(self, disk: DiskInfo, mono: float) -> float:
        """How long this scheduler has seen the disk's last heartbeat unchanged: silence is measured by the
        one watching, so a scheduler started after a whole-cluster outage gives every node time to beat."""
        seen = self.silent.get(disk.disk_id)
        if seen is None or seen[0] != disk.last_heartbeat:
            self.silent[disk.disk_id] = seen = (disk.last_heartbeat, mono)
        return mono - seen[1]

    def _source_fenced(self, disk_id: int, sealed: bool, mono: float) -> bool:
        """`rules.source_fenced`, from what this scheduler saw (a disk clustermgr no longer knows gets no answers)."""
        disk = self.disks.get(disk_id)
        if disk is None:
            return True
        return rules.source_fenced(disk, sealed, self._silent_for(disk, mono),
                                   mono - self.fenced_since.get(disk_id, mono))

    # the table

    def _recorded(self, event: TaskCreated | TaskPersisted | TaskDeleted) -> None:
        """A record written (or found written, or deleted): the table follows. A task no longer waiting for or
        held by a worker holds no lease."""
        if isinstance(event, TaskDeleted):
            del self.tasks[event.task_id]
            return
        self.tasks[event.task.task_id] = event.task
        if isinstance(event, TaskPersisted) and event.task.state is not TaskState.PREPARED:
            self.leases.pop(event.task.task_id, None)

    def _enabled(self) -> dict[TaskType, bool]:
        return {task_type: self.switches.is_on(task_type) for task_type in TaskType}

    def _hold_back(self, task: TaskRecord, reason: str, mono: float) -> None:
        log.warning("task %s: %s", task.task_id, reason)
        self.held_back[task.task_id] = mono + max(self.config.cancel_hold, self.config.round_interval)

    def _seal(self, task: TaskRecord, readonly: bool, mono: float) -> list[Action]:
        """Best effort: the task's source chunk read-only (or writable again), if its node beat lately."""
        return [SetSourcesReadonly((task,), readonly)] if self._heard_from(task.disk_id, mono) else []

    @staticmethod
    def _unlock(task: TaskRecord) -> list[Action]:
        return [UnlockVolume(task.vid)] if task.task_type in LOCKING else []

    @staticmethod
    def _release_destination(task: TaskRecord) -> ReleaseChunk:
        assert task.destination is not None
        return ReleaseChunk(task.destination.host, task.destination.disk_id, task.destination.vuid)

    @staticmethod
    def _redone(task: TaskRecord, reason: str, now: float) -> TaskRecord:
        """The task back to inited after its destination failed (the caller releases it): that disk never tried
        again (unless an operator chose it)."""
        assert task.destination is not None
        avoid = task.avoid_disks if task.target_disk else [*task.avoid_disks, task.destination.disk_id]
        return advance(task, TaskState.INITED, now, destination=None, avoid_disks=avoid, redo=task.redo + 1,
                       reason=reason)

    # the round: disks, preparation, finishing

    def _tick(self, event: Tick) -> list[Action]:
        """Each disk's units still on it get their tasks, then its status is judged; the rest of the round follows."""
        actions: list[Action] = []
        for disk in self.disks.values():
            evacuate = EVACUATE.get(disk.status)
            if evacuate is not None and self.switches.is_on(evacuate):
                units = self.placed.get(disk.disk_id, [])
                actions += [CreateTask(t) for t in rules.units_to_evacuate(disk, units, self.tasks, event.now)]
            actions.append(Resume(Step.DISK, disk.disk_id))
        return [*actions, Resume(ROUND[0])]

    def _resumed(self, event: Resumed) -> list[Action]:
        if event.step is Step.LOADED:
            self.loaded = True
            log.info("loaded %d task records (%d open)", len(self.tasks), sum(t.open for t in self.tasks.values()))
            return []
        if event.step is Step.DISK:
            return self._judge_disk(event.disk_id, event.mono)
        actions = {Step.BALANCE: self._balance, Step.GIVE_BACK: self._give_back_paused, Step.PREPARE: self._prepare,
                   Step.FINISH: self._finish_completed, Step.PRUNE: self._prune}[event.step](event)
        later = ROUND[ROUND.index(event.step) + 1:]
        return [*actions, Resume(later[0])] if later else actions

    def _judge_disk(self, disk_id: int, mono: float) -> list[Action]:
        disk = self.disks.get(disk_id)
        if disk is None:
            return []
        units_left = len(self.placed.get(disk_id, []))
        evacuate = EVACUATE.get(disk.status)
        open_tasks = sum(t.open and t.disk_id == disk_id and t.task_type is evacuate for t in self.tasks.values())
        status = rules.next_disk_status(disk, self._silent_for(disk, mono), self.broken_after, units_left, open_tasks)
        if status is None:
            return []
        log.warning("disk %d (%s): %s -> %s (%d units, %d open tasks)", disk_id, disk.host, disk.status, status,
                    units_left, open_tasks)
        return [SetDiskStatus(disk_id, status)]

    def _balance(self, event: Resumed) -> list[Action]:
        if not self.switches.is_on(TaskType.BALANCE):
            return []
        usable = [d for d in self.disks.values() if d.alive and d.writable]
        task = rules.plan_balance(usable, self.placed, self.tasks.values(), event.now, self.config.balance_threshold,
                                  self.config.balance_per_hour)
        return [] if task is None else [CreateTask(task)]

    def _give_back_paused(self, event: Resumed) -> list[Action]:
        """Paused tasks in the way of a disk repair release their volume (`rules.to_give_back`)."""
        actions: list[Action] = []
        for task in rules.to_give_back(self.tasks.values(), self._enabled(), self.leases, event.mono):
            self.leases.pop(task.task_id, None)
            given_back = advance(task, TaskState.INITED, event.now, destination=None,
                                 reason=f"{task.task_type} is switched off: gave volume {task.vid} to its repair")
            actions += [self._release_destination(task), *self._unlock(task),
                        *self._seal(task, False, event.mono),  # the volume takes writes again: its unit there too
                        PersistTask(given_back),
                        Log(logging.WARNING, f"task {task.task_id} paused and given back: volume {task.vid} has a "
                                             "disk repair waiting")]
        return actions

    def _prepare(self, event: Resumed) -> list[Action]:
        busy = sum(t.state in SEALED for t in self.tasks.values())
        waiting = [t for t in self.tasks.values() if self.held_back.get(t.task_id, 0.0) <= event.mono]
        actions: list[Action] = []
        for task in rules.to_prepare(waiting, self._enabled(), self.config.max_prepared - busy, self.margins):
            volume = self.volumes.get(task.vid)
            if volume is None:
                actions.append(PersistTask(advance(task, TaskState.FINISHED_IN_ADVANCE, event.now,
                                                   reason="volume gone")))
            else:
                actions += self._prepare_one(task, volume, event)
        return actions

    def _prepare_one(self, task: TaskRecord, volume: VolumeInfo, event: Event) -> list[Action]:
        """Lock the volume if the task copies, seal its source, reserve a new unit (epoch + 1) on a disk not tried
        before and create its chunk (carried on by `_preparing`); a failure is retried in a later round on
        another disk."""
        if volume.units[task.unit_index].vuid != task.source_vuid:
            return [PersistTask(advance(task, TaskState.FINISHED_IN_ADVANCE, event.now,
                                        reason="the unit moved already"))]
        if task.task_type in LOCKING and volume.status is not VolumeStatus.LOCK:
            return [LockVolume(task)]
        return self._seal_to_prepare(task, event)

    def _seal_to_prepare(self, task: TaskRecord, event: Event) -> list[Action]:
        """Whatever the task, no blob may land on the old unit after the worker listed the units (the access node
        owes each refused shard a repair, which lands on the new unit): the source chunk is sealed, or its node's
        write fence is waited out (a node cut off from clustermgr that access still reaches)."""
        if self._heard_from(task.disk_id, event.mono):
            return [SealSource(task)]
        return self._preparing(SealResult(task=task, sealed=False, at=event.at))

    def _preparing(self, event: VolumeLocked | SealResult | UnitAllocated | ChunkCreated) -> list[Action]:
        """The next step of a preparation, after the outcome of the last one."""
        task = event.task
        if isinstance(event, VolumeLocked | UnitAllocated) and event.error is not None:
            self._hold_back(task, f"cannot reserve a destination: {event.error}", event.mono)
            return []
        match event:
            case VolumeLocked():
                return self._seal_to_prepare(task, event)
            case SealResult():
                if not self._source_fenced(task.disk_id, event.sealed, event.mono):
                    self._hold_back(task, f"the source on disk {task.disk_id} was not sealed and its node may still "
                                          "take writes: waiting out its write fence", event.mono)
                    return []
                return [AllocUnit(task)]
            case UnitAllocated():
                assert event.destination is not None
                return [CreateChunk(task, event.destination)]
        destination = event.destination
        if event.error is not None:
            self._hold_back(task, f"cannot create the chunk on disk {destination.disk_id}: {event.error}", event.mono)
            if task.target_disk is not None:
                return []
            return [PersistTask(task.model_copy(update={"avoid_disks": [*task.avoid_disks, destination.disk_id]}))]
        return [PersistTask(advance(task, TaskState.PREPARED, event.now, destination=destination, reason="")),
                Log(logging.INFO, f"task {task.task_id} prepared: volume {task.vid} unit {task.unit_index} disk "
                                  f"{task.disk_id} -> {destination.disk_id}")]

    def _finish_completed(self, event: Resumed) -> list[Action]:
        return [ReadUnit(t, None) for t in self.tasks.values() if t.state is TaskState.WORK_COMPLETED]

    def _finish(self, event: UnitSeen) -> list[Action]:
        """Close the destination's task fence, switch the volume's unit to it, release the old chunk, unlock;
        FINISHED. A refused switch (the reservation was superseded) sends the task back to be prepared again; a
        fence that cannot be closed holds the switch for a later round (or, the destination gone, redoes the task)."""
        task = event.task
        assert task.destination is not None
        if event.vuid == task.source_vuid:
            return [SetTaskFence(task, None)]
        if event.vuid != task.destination.vuid:
            return [self._release_destination(task), *self._unlock(task),
                    PersistTask(advance(task, TaskState.FINISHED_IN_ADVANCE, event.now,
                                        reason="the unit moved meanwhile"))]
        return self._finished(task, event)

    def _switched(self, event: UnitSwitched) -> list[Action]:
        task = event.task
        if event.refused is None:
            return self._finished(task, event)
        return [self._release_destination(task),
                PersistTask(advance(task, TaskState.INITED, event.now, destination=None, redo=task.redo + 1,
                                    reason=f"switch refused: {event.refused}"))]

    def _finished(self, task: TaskRecord, event: Event) -> list[Action]:
        assert task.destination is not None
        return [ReleaseChunk(task.source_host, task.disk_id, task.source_vuid), *self._unlock(task),
                PersistTask(advance(task, TaskState.FINISHED, event.now)),
                Log(logging.INFO, f"task {task.task_id} finished: volume {task.vid} unit {task.unit_index} now "
                                  f"{task.destination.vuid} on disk {task.destination.disk_id}")]

    def _fence_set(self, event: FenceSet) -> list[Action]:
        """The destination's task fence opened at a hand-out's token (the task is leased out), or closed (the unit
        is switched); if the blobnode could not, the task is held back for a while, or redone on another disk when
        the destination is gone (`rules.gives_up_destination`)."""
        task = event.task
        assert task.destination is not None
        if event.error is None:
            return [SwitchUnit(task)] if event.token is None else self._hand_out(task, event)
        what = (f"cannot {'open' if event.token else 'close'} the task fence on disk {task.destination.disk_id}: "
                f"{event.error}")
        if rules.gives_up_destination(event.error, self._heard_from(task.destination.disk_id, event.mono)):
            return [self._release_destination(task), PersistTask(self._redone(task, what, event.now))]
        self._hold_back(task, what, event.mono)
        return []

    def _prune(self, event: Resumed) -> list[Action]:
        return [DeleteTask(t) for t in self.tasks.values() if rules.prunable(t, event.now, self.config.keep_finished)]

    # the worker protocol

    def _worker_call(self, event: WorkerAcquire | WorkerHeartbeat | TaskReported | TaskCompleted | TaskCancelled
                     ) -> list[Action]:
        match event:
            case WorkerAcquire():
                return self._acquire(event)
            case WorkerHeartbeat() | TaskCompleted():
                ref = event.ref
            case TaskReported():
                ref = event.progress.ref
            case TaskCancelled():
                ref = event.request.ref
        checked = self._check(ref, event.mono)
        if isinstance(checked, Refuse):
            return [checked]
        task = checked
        match event:
            case TaskReported():
                progress = event.progress.model_dump(exclude={"ref"})
                return [PersistTask(task.model_copy(update={**progress, "mtime": event.now}))]
            case TaskCompleted():
                completed = advance(task, TaskState.WORK_COMPLETED, event.now)
                return [PersistTask(completed),
                        BestEffort(ReadUnit(completed, None), f"task {task.task_id}: finishing later")]
            case TaskCancelled():
                self.leases.pop(task.task_id, None)
                return [ReadUnit(task, event.request)]
        return []

    def _acquire(self, event: WorkerAcquire) -> list[Action]:
        """The next task, under a new token: saved first, then set as its destination's task fence (the task is not
        handed out if the fence cannot be), then leased to the worker (`_hand_out`)."""
        request = event.request
        task = rules.to_hand_out(self.tasks.values(), self.leases, self.held_back, self._enabled(),
                                 request.task_types, event.mono, self.margins, request.urgent_only)
        if task is None or task.destination is None:
            return []
        task = task.model_copy(update={"worker": request.worker, "token": task.token + 1, "mtime": event.now})
        return [PersistTask(task), SetTaskFence(task, task.token)]

    def _hand_out(self, task: TaskRecord, event: Event) -> list[Action]:
        assert task.destination is not None
        self.leases[task.task_id] = Lease(task.worker, event.mono + self.config.task_lease_ttl)
        source_disk = self.disks.get(task.disk_id)
        readable = source_disk is not None and source_disk.status not in UNREADABLE
        ref = TaskRef(task_type=task.task_type, task_id=task.task_id, worker=task.worker,
                      source_vuid=task.source_vuid, destination_vuid=task.destination.vuid, epoch=self.epoch,
                      token=task.token)
        work = WorkTask(ref=ref, vid=task.vid, unit_index=task.unit_index, source=task.source,
                        destination=task.destination, source_readable=readable,
                        urgent=rules.is_urgent(task, self.margins), lease_ttl=self.config.task_lease_ttl,
                        done_bytes=task.done_bytes, done_shards=task.done_shards)
        return [Log(logging.INFO, f"task {task.task_id} handed to {task.worker}"), Answer(AcquireResult(task=work))]

    def _check(self, ref: TaskRef, mono: float) -> TaskRecord | Refuse:
        """The task `ref` names, with its lease renewed, or the refusal: Fenced when it was handed out under an
        older epoch, by a scheduler that has been superseded since; Conflict when it is not the worker's any more."""
        refusal = self.standby_refusal(mono)
        if refusal is not None:
            return Refuse(refusal)
        if ref.epoch != self.epoch:
            self.fenced += 1
            log.warning("fenced %s's call about task %s: epoch %d, not %d", ref.worker, ref.task_id, ref.epoch,
                        self.epoch)
            return Refuse(StaleEpoch(f"task {ref.task_id} was handed out under epoch {ref.epoch}; the lease is at "
                                     f"{self.epoch}"))
        task = self.tasks.get(ref.task_id)
        why = rules.fence(task, ref, self.leases.get(ref.task_id), mono)
        if why is not None:
            return Refuse(Conflict(why))
        assert task is not None
        if not self.switches.is_on(task.task_type):
            return Refuse(Conflict(f"{task.task_type} is switched off: task paused"))
        self.leases[ref.task_id] = Lease(ref.worker, mono + self.config.task_lease_ttl)
        return task

    def _cancel(self, event: UnitSeen) -> list[Action]:
        """A worker gave its task back: done if the unit moved meanwhile, redone elsewhere if the destination
        failed, else held back for `cancel_hold` and handed out again."""
        task, request = event.task, event.cancel
        assert request is not None
        actions: list[Action] = []
        if event.vuid != task.source_vuid:
            task = advance(task, TaskState.FINISHED_IN_ADVANCE, event.now, reason=f"the unit moved: {request.reason}")
        elif request.destination_failed and task.destination is not None:
            actions.append(self._release_destination(task))
            task = self._redone(task, request.reason, event.now)
        else:
            self.held_back[task.task_id] = event.mono + self.config.cancel_hold
            task = task.model_copy(update={"reason": request.reason, "mtime": event.now})
        if not task.open:
            actions += self._unlock(task)
        return [*actions, PersistTask(task),
                Log(logging.WARNING, f"task {task.task_id} cancelled by {request.ref.worker}: {request.reason} -> "
                                     f"{task.state}")]

    def _migrate(self, event: MigrateAsked) -> list[Action]:
        request, volume = event.request, event.volume
        if request.index >= len(volume.units):
            return [Refuse(Conflict(f"volume {request.vid} has {len(volume.units)} units, no unit {request.index}"))]
        if request.disk_id is not None and any(u.disk_id == request.disk_id for u in volume.units):
            return [Refuse(Conflict(f"disk {request.disk_id} already holds a unit of volume {request.vid}"))]
        task = rules.new_task(TaskType.MANUAL_MIGRATE, volume, request.index, event.now)
        existing = self.tasks.get(task.task_id)
        if existing is not None and existing.open:
            return [Refuse(Conflict(f"task {task.task_id} already moves that unit ({existing.state})"))]
        task = task.model_copy(update={"target_disk": request.disk_id})
        return [PersistTask(task), Answer(task)]

    def status(self, mono: float) -> SchedulerStatus:
        return SchedulerStatus(host=self.me, active=self.active(mono), leader=self.election.leader,
                               open_tasks=sum(t.open for t in self.tasks.values()),
                               leased_tasks=sum(lease.expires > mono for lease in self.leases.values()))
