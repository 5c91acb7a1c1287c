"""The scheduler's decisions, free of I/O: task states, which task to prepare or hand out next, fencing,
and what a disk's status becomes. `scheduler.py` feeds them what it read and carries out the answers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from blobstore_server.libs.ec import tactic
from blobstore_server.libs.proto.cluster import DiskInfo, DiskStatus, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import URGENT_MARGIN, TaskRecord, TaskRef, TaskState
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc.errors import RpcError, Unavailable

# Which state a task may move to next; anything else is a bug in the caller.
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.INITED: frozenset({TaskState.PREPARED, TaskState.FINISHED_IN_ADVANCE}),
    # back to inited: the destination failed, a new one is prepared
    TaskState.PREPARED: frozenset({TaskState.WORK_COMPLETED, TaskState.INITED, TaskState.FINISHED_IN_ADVANCE}),
    # back to inited: the volume refused the switch to this destination
    TaskState.WORK_COMPLETED: frozenset({TaskState.FINISHED, TaskState.INITED, TaskState.FINISHED_IN_ADVANCE}),
    TaskState.FINISHED: frozenset(),
    TaskState.FINISHED_IN_ADVANCE: frozenset(),
}

# Disk repair first (every blob on a broken disk is one failure closer to loss), then the operator's asks.
PRIORITY = (TaskType.DISK_REPAIR, TaskType.MANUAL_MIGRATE, TaskType.DISK_DROP, TaskType.BALANCE)
# Tasks that copy from a source that still works: the volume is locked first, so no new blob goes to it (every
# task makes its source chunk read-only, if its node answers: no blob lands on the old unit after it was listed).
LOCKING = frozenset({TaskType.DISK_DROP, TaskType.BALANCE, TaskType.MANUAL_MIGRATE})
# A balance waits for these to finish: they move units already, and need the room.
BALANCE_WAITS_FOR = frozenset({TaskType.DISK_REPAIR, TaskType.DISK_DROP, TaskType.BALANCE})
# Disk statuses whose units the scheduler moves off, and by which task type.
EVACUATE = {DiskStatus.BROKEN: TaskType.DISK_REPAIR, DiskStatus.REPAIRING: TaskType.DISK_REPAIR,
            DiskStatus.DROPPING: TaskType.DISK_DROP}


NO_LOSS = 1 << 8  # the margin sort key of a volume with no lost unit


class BadTransition(Exception):
    pass


def advance(task: TaskRecord, state: TaskState, now: float, **changes: object) -> TaskRecord:
    """The task in `state` (with `changes`), or BadTransition."""
    if state is not task.state and state not in TASK_TRANSITIONS[task.state]:
        raise BadTransition(f"task {task.task_id} cannot go from {task.state} to {state}")
    return task.model_copy(update={**changes, "state": state, "mtime": now})


def task_id(task_type: TaskType, disk_id: int, vuid: int) -> str:
    """One task per unit epoch and purpose: creating it twice (a scheduler restarted midway) is a no-op."""
    unit = Vuid(vuid)
    return f"{task_type}-{disk_id}-{unit.vid()}-{unit.index()}-{unit.epoch()}"


def new_task(task_type: TaskType, volume: VolumeInfo, index: int, now: float) -> TaskRecord:
    unit = volume.units[index]
    return TaskRecord(task_id=task_id(task_type, unit.disk_id, unit.vuid), task_type=task_type, disk_id=unit.disk_id,
                      vid=volume.vid, unit_index=index, source_vuid=unit.vuid, source_host=unit.host, ctime=now,
                      mtime=now)


Placed = tuple[VolumeInfo, int]  # a volume and the index of one of its units


def units_by_disk(volumes: Iterable[VolumeInfo]) -> dict[int, list[Placed]]:
    """Each disk's units, in volume order. Built once a round, so a question about one disk costs that disk's
    units, not every unit of every volume (at 20,000 volumes on 96 disks, per-disk scans took 4.6 s a round)."""
    placed: dict[int, list[Placed]] = defaultdict(list)
    for volume in volumes:
        for index, unit in enumerate(volume.units):
            placed[unit.disk_id].append((volume, index))
    return placed


def units_to_evacuate(disk: DiskInfo, units: Iterable[Placed], tasks: Mapping[str, TaskRecord],
                      now: float) -> list[TaskRecord]:
    """New tasks for the units still on a disk (`units`: its units) being repaired or dropped that have none yet."""
    task_type = EVACUATE.get(disk.status)
    if task_type is None:
        return []
    return [new_task(task_type, volume, index, now) for volume, index in units
            if task_id(task_type, disk.disk_id, volume.units[index].vuid) not in tasks]


def next_disk_status(disk: DiskInfo, silent_for: float, broken_after: float | None, units_left: int,
                     open_tasks: int) -> DiskStatus | None:
    """Where the scheduler takes a disk next, or None. A disk silent for longer than `broken_after` seconds
    (None: never by silence) turns broken; once its tasks exist it is repairing; with no unit and no task
    left it is repaired (or dropped)."""
    status = disk.status
    if status is DiskStatus.NORMAL:
        silent = broken_after is not None and disk.last_heartbeat > 0 and silent_for > broken_after
        return DiskStatus.BROKEN if silent else None
    if status is DiskStatus.BROKEN:
        return DiskStatus.REPAIRING if open_tasks or not units_left else None
    if status in (DiskStatus.REPAIRING, DiskStatus.DROPPING) and not units_left and not open_tasks:
        return DiskStatus.REPAIRED if status is DiskStatus.REPAIRING else DiskStatus.DROPPED
    return None


# Waiting out a node's write fence on another clock: clocks run at slightly different rates.
FENCE_SLACK, FENCE_PAD = 1.1, 1.0


def source_fenced(disk: DiskInfo, sealed: bool, silent_for: float, fenced_status_for: float) -> bool:
    """Whether no PUT can land on a task's source any more, so a worker may list the units (a shard landing after
    that would never reach the new unit): its chunk answered the seal, or its node's write fence is shut, because
    clustermgr has committed no heartbeat of it for longer than the disk's `write_fence_s`, or has had the disk in
    a status that takes no writes (`WRITE_FENCED`) for that long (a beat answered before the change keeps the node
    open at most that long). Both are measured by the scheduler from when it saw them begin: no earlier than they
    began for the node."""
    wait = disk.write_fence_s * FENCE_SLACK + FENCE_PAD
    return sealed or silent_for > wait or fenced_status_for > wait


def volume_margins(volumes: Iterable[VolumeInfo], lost_disks: Collection[int]) -> dict[int, int]:
    """Losses each volume can still take before blobs are gone: its code mode's global parity count minus
    its units on lost disks (broken, repairing, or silent). Only volumes with a lost unit are listed."""
    margins = {}
    for volume in volumes:
        lost = sum(u.disk_id in lost_disks for u in volume.units)
        if lost:
            margins[volume.vid] = tactic(volume.code_mode).m - lost
    return margins


def is_urgent(task: TaskRecord, margins: Mapping[int, int]) -> bool:
    """A repair whose volume is at margin <= URGENT_MARGIN: rebuilt ahead of everything, past the caps."""
    return task.task_type is TaskType.DISK_REPAIR and margins.get(task.vid, URGENT_MARGIN + 1) <= URGENT_MARGIN


def busy_volumes(tasks: Iterable[TaskRecord]) -> set[int]:
    """Volumes with a task past inited and not final: one background task per volume at a time."""
    return {t.vid for t in tasks if t.state in (TaskState.PREPARED, TaskState.WORK_COMPLETED)}


def _order(task: TaskRecord, margins: Mapping[int, int]) -> tuple[int, int, float]:
    """Task type first (disk repair leads), then the volume's margin (the fewest spare losses first), then age."""
    kind = PRIORITY.index(task.task_type) if task.task_type in PRIORITY else len(PRIORITY)
    return kind, margins.get(task.vid, NO_LOSS), task.ctime


def to_prepare(tasks: Iterable[TaskRecord], enabled: Mapping[TaskType, bool], room: int,
               margins: Mapping[int, int]) -> list[TaskRecord]:
    """Inited tasks to prepare now, most urgent first: at most `room` besides the urgent ones (which never
    wait for room), one per volume, none on a busy volume, none whose switch is off."""
    tasks = list(tasks)
    busy = busy_volumes(tasks)
    chosen: list[TaskRecord] = []
    for task in sorted((t for t in tasks if t.state is TaskState.INITED), key=lambda t: _order(t, margins)):
        urgent = is_urgent(task, margins)
        if len(chosen) >= room and not urgent:
            break
        if enabled.get(task.task_type, True) and task.vid not in busy:
            busy.add(task.vid)
            chosen.append(task)
            room += urgent
    return chosen


@dataclass
class Lease:
    worker: str
    expires: float  # monotonic


def to_give_back(tasks: Iterable[TaskRecord], enabled: Mapping[TaskType, bool], leases: Mapping[str, Lease],
                 now: float) -> list[TaskRecord]:
    """Prepared tasks switched off (paused), held by no live lease, on a volume whose disk repair waits to be
    prepared: they go back to inited (their destination released, the volume unlocked), or a paused balance
    or drop would hold the volume's repair for as long as its switch stays off. `now` is monotonic."""
    if not enabled.get(TaskType.DISK_REPAIR, True):
        return []
    tasks = list(tasks)
    repairs_waiting = {t.vid for t in tasks if t.state is TaskState.INITED and t.task_type is TaskType.DISK_REPAIR}
    return [t for t in tasks
            if t.state is TaskState.PREPARED and not enabled.get(t.task_type, True) and t.vid in repairs_waiting
            and ((lease := leases.get(t.task_id)) is None or lease.expires <= now)]


def to_hand_out(tasks: Iterable[TaskRecord], leases: Mapping[str, Lease], held_back: Mapping[str, float],
                enabled: Mapping[TaskType, bool], wanted: Sequence[TaskType], now: float,
                margins: Mapping[int, int], urgent_only: bool = False) -> TaskRecord | None:
    """The prepared task a worker gets next: no live lease, not held back after a cancel, switch on, of a
    type the worker asked for (any if none; only urgent ones for a worker's urgent lane), disk repair first,
    the lowest volume margin next, then the oldest. `now` is monotonic."""
    def free(task: TaskRecord) -> bool:
        lease = leases.get(task.task_id)
        return ((lease is None or lease.expires <= now) and held_back.get(task.task_id, 0.0) <= now
                and enabled.get(task.task_type, True) and (not wanted or task.task_type in wanted)
                and (not urgent_only or is_urgent(task, margins)))

    ready = [t for t in tasks if t.state is TaskState.PREPARED and free(t)]
    return min(ready, key=lambda t: _order(t, margins), default=None)


def fence(task: TaskRecord | None, ref: TaskRef, lease: Lease | None, now: float) -> str | None:
    """Why a worker's call about `ref` is refused, or None. The units and the hand-out's token are the fencing
    tokens: a worker handed an older destination, another worker's task, or the same task before it was handed
    out again, can never report or commit. A task with no lease in memory is taken back by the worker holding its
    units and token."""
    if task is None or task.task_type != ref.task_type:
        return f"no task {ref.task_type}/{ref.task_id}"
    if task.state is not TaskState.PREPARED:
        return f"task {ref.task_id} is {task.state}"
    if task.source_vuid != ref.source_vuid or task.destination is None or task.destination.vuid != ref.destination_vuid:
        return f"task {ref.task_id} moves {task.source_vuid} -> {task.destination and task.destination.vuid} now"
    if lease is not None and lease.worker != ref.worker and lease.expires > now:
        return f"task {ref.task_id} is held by {lease.worker}"
    if task.token != ref.token:
        return f"task {ref.task_id} was handed out again (token {task.token}, not {ref.token})"
    return None


def gives_up_destination(error: RpcError, heard_from: bool) -> bool:
    """Whether a task fence the destination's blobnode could not set means the destination is gone (the task
    is redone on another disk) rather than out of reach for a moment (tried again in a later round): only an
    unreachable node that beat lately gets another chance."""
    return not (isinstance(error, Unavailable) and heard_from)


def prunable(task: TaskRecord, now: float, keep_finished: float) -> bool:
    """A final record past its keeping time."""
    return not task.open and now - task.mtime > keep_finished


def units_per_disk(disks: Iterable[DiskInfo], placed: Mapping[int, Sequence[Placed]]) -> dict[int, int]:
    return {d.disk_id: len(placed.get(d.disk_id, ())) for d in disks}


def plan_balance(disks: Sequence[DiskInfo], placed: Mapping[int, Sequence[Placed]], tasks: Iterable[TaskRecord],
                 now: float, threshold: int, per_hour: int) -> TaskRecord | None:
    """One unit to move from the fullest disk to the emptiest one it may go to (same AZ, no unit of that
    volume there), or None. Fullness is units per disk. Only when the two differ by `threshold` (>= 2) units,
    so every move narrows the spread and balance stops instead of ping-ponging (CubeFS #3939); never while a
    repair, drop or other balance is open, nor past `per_hour` balance tasks in the last hour. `disks` are the
    ones that may take chunks (alive, normal, writable); `placed`, every disk's units. The unit chosen holds the
    most data (moving empty chunks relieves nothing: CubeFS #3940), idle volumes before leased ones."""
    tasks = list(tasks)
    if any(t.open and t.task_type in BALANCE_WAITS_FOR for t in tasks):
        return None
    if sum(t.task_type is TaskType.BALANCE and now - t.ctime < 3600 for t in tasks) >= per_hour:
        return None
    counts = units_per_disk(disks, placed)
    by_id = {d.disk_id: d for d in disks}
    busy = {t.vid for t in tasks if t.open}
    for source in sorted(counts, key=lambda d: (-counts[d], d)):
        candidates = [(volume, index) for volume, index in placed.get(source, ()) if volume.vid not in busy]
        for volume, index in sorted(candidates, key=lambda c: (c[0].status is not VolumeStatus.IDLE, -c[0].used)):
            held = {u.disk_id for u in volume.units}
            targets = [d for d in counts if d not in held and by_id[d].idc == by_id[source].idc
                       and counts[source] - counts[d] >= max(threshold, 2)]
            if targets:
                target = min(targets, key=lambda d: (counts[d], d))
                return new_task(TaskType.BALANCE, volume, index, now).model_copy(update={"target_disk": target})
    return None


@dataclass(frozen=True)
class InspectFinding:
    """What one volume's shard lists say: shards to repair per bid, and bids below N shards (lost)."""

    repairs: dict[int, list[int]]  # bid -> unit indexes missing it
    lost: list[int]


def inspect_volume(listings: Sequence[Mapping[int, str]], data_shards: int) -> InspectFinding:
    """Compare the bid lists of every unit of a volume (bid -> shard status). A bid mark-deleted anywhere is
    being deleted and left alone; a bid present on some units but not all is missing shards, repairable
    while at least `data_shards` are present, lost otherwise."""
    bids = set().union(*listings) if listings else set()
    repairs: dict[int, list[int]] = {}
    lost: list[int] = []
    for bid in sorted(bids):
        statuses = [listing.get(bid) for listing in listings]
        if any(s is not None and s != "normal" for s in statuses):
            continue
        missing = [i for i, s in enumerate(statuses) if s is None]
        if not missing:
            continue
        if len(listings) - len(missing) >= data_shards:
            repairs[bid] = missing
        else:
            lost.append(bid)
    return InspectFinding(repairs, lost)
