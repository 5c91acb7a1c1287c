"""The scheduler's state machine driven without processes, against a cluster faked action by action: takeover (a
new leader loads the records, seals their sources and resumes them; a worker of the old epoch is refused, and a
superseded leader's changes are), fencing (a stale lease or hand-out refused, no preparation before the source
is sealed or its write fence waited out, no switch before the destination's task fence is closed), and every
outcome of preparing, finishing and cancelling a task; random runs keep the table written through."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from blobstore_server.libs.proto.cluster import DiskStatus, Unit, VolumeInfo
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import (
    AcquireRequest,
    AcquireResult,
    LeaderRecord,
    ManualMigrate,
    TaskCancel,
    TaskProgress,
    TaskRecord,
    TaskRef,
    TaskState,
    WorkTask,
)
from blobstore_server.libs.proto.switches import OFF, TaskType, switch_key
from blobstore_server.libs.rpc.errors import Conflict, Fenced, NotFound, NotLeader, RpcError, Unavailable
from blobstore_server.services.scheduler import rules
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.scheduler.events import (
    Action,
    AllocUnit,
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
    Instant,
    LeaderSeen,
    LeaseGranted,
    LeaseLost,
    LockVolume,
    MigrateAsked,
    PersistTask,
    ReadUnit,
    ReleaseChunk,
    SealResult,
    SealSource,
    SetDiskStatus,
    SetSourcesReadonly,
    SetTaskFence,
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
    drive,
)
from blobstore_server.services.scheduler.scheduler import Scheduler
from blobstore_server.services.scheduler.state import SchedulerState

ME, OTHER = "http://s1", "http://s2"
CONFIG = SchedulerConfig(clustermgr_hosts=["http://cm"], host=ME, election_ttl=6.0, task_lease_ttl=10.0,
                         round_interval=1.0, cancel_hold=5.0, disk_lost_after=30.0, keep_finished=60.0)
QUIET_SWITCHES = {switch_key(TaskType.BALANCE): OFF}
SPARE = (7, 8, 9)  # disks holding no unit: destinations
ANSWERED_WITH_ERROR = (LockVolume, SealSource, AllocUnit, CreateChunk, SetTaskFence, SwitchUnit)
UNFENCED = (ClaimLease, FenceWith, ReadUnit)  # the election client is unfenced; reads change nothing


def volume(vid: int) -> VolumeInfo:
    units = [Unit(vuid=Vuid.make(vid, i, 1), disk_id=i + 1, host=f"http://n{i + 1}") for i in range(6)]
    return VolumeInfo(vid=vid, code_mode=11, backend="isal", capacity=1 << 30, units=units)  # EC3P3


class World:
    """clustermgr (the election record, the kv, disks and volumes) and the blobnodes, as the actions meet them.
    `fail` makes every call of a kind fail; a state whose epoch is superseded is refused every change."""

    def __init__(self, volumes: int = 3, config: dict[str, str] | None = None) -> None:
        self.at = Instant(1000.0, 0.0)
        self.leader: LeaderRecord | None = None
        self.config = dict(QUIET_SWITCHES if config is None else config)
        self.kv: dict[str, TaskRecord] = {}
        self.disks = {d: DiskView(disk_id=d, host=f"http://n{d}", idc="z0", rack="r", path="/d", alive=True,
                                  last_heartbeat=1.0, write_fence_s=20.0) for d in range(1, 10)}
        self.volumes = {vid: volume(vid) for vid in range(1, volumes + 1)}
        self.quiet: set[int] = set()  # disks whose node stopped beating
        self.fail: dict[type[Action], RpcError] = {}
        self.sealed = True  # what a seal answers
        self.fences: dict[int, int | None] = {}  # destination vuid -> its task fence's token (None: closed)
        self.fence_epoch = 0
        self.calls: list[Action] = []
        self.allocated = 0

    def clock(self) -> Instant:
        return self.at

    def tick(self, seconds: float) -> None:
        self.at = Instant(self.at.now + seconds, self.at.mono + seconds)

    def beat(self) -> None:
        for d, disk in self.disks.items():
            if d not in self.quiet:
                self.disks[d] = disk.model_copy(update={"last_heartbeat": disk.last_heartbeat + 1})

    def performer(self, state: SchedulerState) -> Callable[[Action], Awaitable[Event | None]]:
        async def perform(action: Action) -> Event | None:
            self.calls.append(action)
            if self.leader is not None and state.epoch < self.leader.epoch and not isinstance(action, UNFENCED):
                raise Fenced(f"epoch {state.epoch} is superseded")
            error = self.fail.get(type(action))
            if error is not None and (isinstance(error, Fenced) or not isinstance(action, ANSWERED_WITH_ERROR)):
                raise error
            return self.answer(action, error)
        return perform

    def answer(self, action: Action, error: RpcError | None) -> Event | None:
        at = self.at
        match action:
            case ClaimLease():
                if self.leader != action.claim.expected:
                    return LeaseLost(at=at)
                self.leader = action.claim.record
                return LeaseGranted(claim=action.claim, started=action.started, at=at)
            case FenceWith():
                self.fence_epoch = action.epoch
            case CreateTask():
                return TaskCreated(task=self.kv.setdefault(action.task.key, action.task), at=at)
            case PersistTask():
                before = self.kv.get(action.task.key)
                assert before is None or rules.advance(before, action.task.state, 0.0)  # a transition in the table
                self.kv[action.task.key] = action.task
                return TaskPersisted(task=action.task, at=at)
            case DeleteTask():
                del self.kv[action.task.key]
                return TaskDeleted(task_id=action.task.task_id, at=at)
            case SetDiskStatus():
                self.disks[action.disk_id] = self.disks[action.disk_id].model_copy(update={"status": action.status})
            case LockVolume():
                return VolumeLocked(task=action.task, error=error, at=at)
            case SealSource():
                return SealResult(task=action.task, sealed=error is None and self.sealed, at=at)
            case AllocUnit():
                return self.allocate(action.task, error)
            case CreateChunk():
                return ChunkCreated(task=action.task, destination=action.destination, error=error, at=at)
            case SetTaskFence():
                return self.set_fence(action, error)
            case ReadUnit():
                vuid = self.volumes[action.task.vid].units[action.task.unit_index].vuid
                return UnitSeen(task=action.task, vuid=vuid, cancel=action.cancel, at=at)
            case SwitchUnit():
                return self.switch(action, error)
            case SetSourcesReadonly() | ReleaseChunk() | UnlockVolume():
                pass
        return None

    def allocate(self, task: TaskRecord, error: RpcError | None) -> UnitAllocated:
        if error is not None:
            return UnitAllocated(task=task, destination=None, error=error, at=self.at)
        disk = task.target_disk or next((d for d in SPARE if d not in task.avoid_disks), None)
        if disk is None:
            return UnitAllocated(task=task, destination=None, error=Conflict("no disk fits"), at=self.at)
        self.allocated += 1
        vuid = Vuid.make(task.vid, task.unit_index, Vuid(task.source_vuid).epoch() + self.allocated)
        destination = Unit(vuid=vuid, disk_id=disk, host=f"http://n{disk}")
        return UnitAllocated(task=task, destination=destination, error=None, at=self.at)

    def set_fence(self, action: SetTaskFence, error: RpcError | None) -> FenceSet:
        assert action.task.destination is not None
        if error is None:
            self.fences[action.task.destination.vuid] = action.token
        return FenceSet(task=action.task, token=action.token, error=error, at=self.at)

    def switch(self, action: SwitchUnit, error: RpcError | None) -> UnitSwitched:
        task = action.task
        assert task.destination is not None
        assert task.destination.vuid in self.fences and self.fences[task.destination.vuid] is None, \
            "a unit switched to a destination whose task fence is open"
        if isinstance(error, Conflict):
            return UnitSwitched(task=task, refused=error, at=self.at)
        units = list(self.volumes[task.vid].units)
        units[task.unit_index] = task.destination
        self.volumes[task.vid] = self.volumes[task.vid].model_copy(update={"units": units})
        return UnitSwitched(task=task, refused=None, at=self.at)


def go(state: SchedulerState, world: World, event: Event) -> AcquireResult | TaskRecord | None:
    """`drive`, run to its end at once: the fake cluster never waits."""
    running = drive(state.handle, event, world.performer(state), world.clock)
    try:
        running.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the drive waited")


def elect(world: World, me: str = ME) -> SchedulerState:
    """A new instance campaigning until it holds the lease (a whole ttl after the record last changed), loaded."""
    state = SchedulerState(CONFIG.model_copy(update={"host": me}))
    go(state, world, LeaderSeen(record=world.leader, at=world.at))
    if not state.active(world.at.mono):
        world.tick(CONFIG.election_ttl)
        go(state, world, LeaderSeen(record=world.leader, at=world.at))
    assert state.active(world.at.mono) and world.fence_epoch == state.epoch
    go(state, world, TasksLoaded(tasks=list(world.kv.values()), disks=list(world.disks.values()), at=world.at))
    assert state.loaded
    return state


def renew(state: SchedulerState, world: World) -> None:
    go(state, world, LeaderSeen(record=world.leader, at=world.at))


def round_(state: SchedulerState, world: World) -> None:
    world.beat()
    go(state, world, ConfigSeen(config=world.config, at=world.at))
    go(state, world, ClusterSeen(disks=list(world.disks.values()), volumes=dict(world.volumes), at=world.at))
    go(state, world, Tick(at=world.at))


def acquire(state: SchedulerState, world: World, worker: str) -> WorkTask | None:
    answer = go(state, world, WorkerAcquire(request=AcquireRequest(worker=worker), at=world.at))
    assert answer is None or isinstance(answer, AcquireResult)  # None: nothing to hand out
    return answer.task if answer else None


def calls(world: World, *kinds: type[Action]) -> list[Action]:
    return [c for c in world.calls if isinstance(c, kinds)]


def seeded(world: World, task: TaskRecord) -> TaskRecord:
    world.kv[task.key] = task
    return task


def prepared(task_type: TaskType = TaskType.DISK_REPAIR, state: TaskState = TaskState.PREPARED, vid: int = 1,
             index: int = 0, disk: int = 7) -> TaskRecord:
    """A task past preparation, as an earlier leader left it: its destination on `disk`, handed out once."""
    task = rules.new_task(task_type, volume(vid), index, 1000.0)
    destination = Unit(vuid=Vuid.make(vid, index, 2), disk_id=disk, host=f"http://n{disk}")
    return task.model_copy(update={"state": state, "destination": destination, "token": 1, "worker": "w0"})


# leadership and takeover


def test_the_lease_is_claimed_renewed_and_lost_and_a_standby_refuses_calls() -> None:
    world = World()
    leader = elect(world)
    assert (leader.epoch, world.leader) == (1, LeaderRecord(host=ME, term=1, epoch=1))
    standby = SchedulerState(CONFIG.model_copy(update={"host": OTHER}))
    go(standby, world, LeaderSeen(record=world.leader, at=world.at))
    assert not standby.active(world.at.mono)
    ref = TaskRef(task_type=TaskType.DISK_REPAIR, task_id="t", worker="w", source_vuid=1, destination_vuid=2, epoch=1)
    with pytest.raises(NotLeader) as refused:
        go(standby, world, WorkerHeartbeat(ref=ref, at=world.at))
    assert refused.value.details["leader"] == ME
    world.calls.clear()
    renew(leader, world)  # the same epoch, a new term: nothing is fenced again
    assert world.leader == LeaderRecord(host=ME, term=2, epoch=1) and not calls(world, FenceWith)
    go(leader, world, LeaseLost(at=world.at))
    go(leader, world, CampaignPassed(at=world.at))
    assert not leader.active(world.at.mono) and not leader.loaded


def test_a_new_leader_loads_the_tasks_seals_their_sources_and_resumes_them() -> None:
    """The old leader prepares three repairs, hands two out, one completes but cannot be finished yet; the new
    leader seals the sources past preparation, finishes the completed one, hands the other out again under a
    new token at the progress reported (the old worker's calls refused), and the old leader, waking up,
    changes nothing and stands by."""
    world = World()
    old = elect(world, OTHER)
    world.disks[1] = world.disks[1].model_copy(update={"status": DiskStatus.BROKEN})
    round_(old, world)
    assert sorted(t.state for t in old.tasks.values()) == [TaskState.PREPARED] * 3
    moving, completed = acquire(old, world, "w1"), acquire(old, world, "w2")
    assert moving is not None and completed is not None and moving.ref.epoch == 1
    progress = TaskProgress(ref=moving.ref, done_bytes=5, done_shards=1, total_bytes=9, total_shards=2)
    go(old, world, TaskReported(progress=progress, at=world.at))
    world.fail[ReadUnit] = Unavailable("clustermgr is electing")
    go(old, world, TaskCompleted(ref=completed.ref, at=world.at))  # finishing later
    assert old.tasks[completed.ref.task_id].state is TaskState.WORK_COMPLETED
    del world.fail[ReadUnit]

    world.calls.clear()
    new = elect(world)
    assert new.epoch == 2 and world.fence_epoch == 2
    past_preparation = sorted(t.task_id for t in world.kv.values() if t.state is not TaskState.FINISHED)
    assert len(past_preparation) == 3  # the third was prepared, never handed out
    sealed = calls(world, SetSourcesReadonly)
    assert [(sorted(t.task_id for t in c.tasks), c.readonly) for c in sealed if isinstance(c, SetSourcesReadonly)] \
        == [(past_preparation, True)]
    round_(new, world)
    assert new.tasks[completed.ref.task_id].state is TaskState.FINISHED
    assert world.volumes[completed.vid].units[completed.unit_index] == completed.destination

    with pytest.raises(Fenced):  # the old worker, under the old epoch
        go(new, world, TaskReported(progress=progress, at=world.at))
    assert new.fenced == 1
    again = acquire(new, world, "w3")
    assert again is not None and again.ref.task_id == moving.ref.task_id
    assert (again.ref.epoch, again.ref.token, again.done_bytes) == (2, moving.ref.token + 1, 5)
    assert world.fences[again.destination.vuid] == again.ref.token == world.kv[new.tasks[again.ref.task_id].key].token

    # The old leader, paused through the takeover, wakes mid-round: its first change is refused, it stands by.
    with pytest.raises(Fenced) as refused:
        round_(old, world)
    go(old, world, Superseded(reason=str(refused.value), at=world.at))
    assert (old.loaded, old.tasks, old.fenced, old.active(world.at.mono)) == (False, {}, 1, False)
    go(old, world, Superseded(reason="counted once per lease lost", at=world.at))
    assert old.fenced == 1


def test_a_stale_lease_or_hand_out_is_refused() -> None:
    world = World()
    task = seeded(world, prepared())
    state = elect(world)
    first = acquire(state, world, "w1")
    assert first is not None and acquire(state, world, "w2") is None  # leased
    world.tick(CONFIG.task_lease_ttl + 1)
    renew(state, world)
    second = acquire(state, world, "w2")
    assert second is not None and second.ref.token == first.ref.token + 1
    progress = TaskProgress(ref=first.ref, done_bytes=1, done_shards=1, total_bytes=2, total_shards=2)
    for event in (WorkerHeartbeat(ref=first.ref, at=world.at), TaskReported(progress=progress, at=world.at),
                  TaskCompleted(ref=first.ref, at=world.at)):
        with pytest.raises(Conflict, match="held by w2"):
            go(state, world, event)
    world.tick(CONFIG.task_lease_ttl + 1)  # w2's lease lapsed too: the token still tells the hand-outs apart
    renew(state, world)
    with pytest.raises(Conflict, match="handed out again"):
        go(state, world, TaskCompleted(ref=first.ref, at=world.at))
    go(state, world, TaskCompleted(ref=second.ref, at=world.at))
    assert state.tasks[task.task_id].state is TaskState.FINISHED


# fencing the source before preparing


@pytest.mark.parametrize(("silent", "sealed", "status_for", "prepares"), [
    (0.0, True, None, True),  # the seal answered
    (0.0, False, None, False),  # not sealed and the node beats: it may take writes
    (25.0, False, None, True),  # not sealed, but silent past its write fence (20 s * 1.1 + 1)
    (31.0, False, None, True),  # silent past disk_lost_after: not even asked to seal
    (0.0, False, 24.0, True),  # in a status that takes no writes for longer than its write fence
    (0.0, False, 10.0, False),
])
def test_a_task_is_prepared_only_once_its_source_is_sealed_or_fenced(silent: float, sealed: bool,
                                                                       status_for: float | None,
                                                                       prepares: bool) -> None:
    world = World(config={**QUIET_SWITCHES, switch_key(TaskType.DISK_REPAIR): OFF})
    world.sealed = sealed
    state = elect(world)
    if silent:
        world.quiet.add(1)
    if status_for is not None:
        world.disks[1] = world.disks[1].model_copy(update={"status": DiskStatus.BROKEN})
    round_(state, world)
    world.tick(silent or status_for or 0.0)
    renew(state, world)
    task = go(state, world, MigrateAsked(request=ManualMigrate(vid=1, index=0), volume=world.volumes[1], at=world.at))
    assert isinstance(task, TaskRecord)
    world.calls.clear()
    round_(state, world)
    assert bool(calls(world, SealSource)) is (silent <= CONFIG.disk_lost_after)
    assert bool(calls(world, AllocUnit)) is prepares
    assert (state.tasks[task.task_id].state is TaskState.PREPARED) is prepares
    assert (task.task_id in state.held_back) is not prepares


# every outcome of a preparation, a finish and a cancel

FAILS = {LockVolume: Unavailable("lock"), SealSource: Unavailable("seal"), AllocUnit: Conflict("no room"),
         CreateChunk: Unavailable("disk full")}
STEPS = (LockVolume, SealSource, AllocUnit, CreateChunk)


@pytest.mark.parametrize(("task_type", "target"), [(TaskType.DISK_REPAIR, None), (TaskType.MANUAL_MIGRATE, None),
                                                   (TaskType.MANUAL_MIGRATE, 8)])
def test_every_outcome_of_a_preparation(task_type: TaskType, target: int | None) -> None:
    for failing in itertools.product((False, True), repeat=len(STEPS)):
        world = World()
        task = seeded(world, rules.new_task(task_type, volume(1), 0, 1000.0).model_copy(update={"target_disk": target}))
        world.fail = {step: FAILS[step] for step, fails in zip(STEPS, failing, strict=True) if fails}
        state = elect(world)
        world.calls.clear()
        round_(state, world)
        steps = [step for step in STEPS if step is not LockVolume or task_type in rules.LOCKING]
        first_failure = next((s for s in steps if s in world.fail), None)
        expected = steps[:steps.index(first_failure) + 1] if first_failure else steps
        assert [type(c) for c in calls(world, *STEPS)] == expected, failing
        after = state.tasks[task.task_id]
        assert world.kv[task.key] == after
        if first_failure is None:
            assert after.state is TaskState.PREPARED and after.destination is not None
            assert after.destination.disk_id == (target or SPARE[0]) and task.task_id not in state.held_back
            continue
        assert after.state is TaskState.INITED and after.destination is None and task.task_id in state.held_back
        assert after.avoid_disks == ([SPARE[0]] if first_failure is CreateChunk and target is None else [])


DESTINATION_GONE, NODE_AWAY = NotFound("no such chunk"), Unavailable("timed out")


@pytest.mark.parametrize("task_type", [TaskType.DISK_REPAIR, TaskType.BALANCE])
def test_every_outcome_of_a_finish(task_type: TaskType) -> None:
    """A completed task finishes only through a closed task fence and a switch; what else can happen sends it
    back to be prepared, or waits, or finds it done already."""
    for unit_at, fence, dest_known, refused in itertools.product(("source", "destination", "elsewhere"),
                                                                 (None, NODE_AWAY, DESTINATION_GONE), (True, False),
                                                                 (False, True)):
        world = World()
        task = seeded(world, prepared(task_type, TaskState.WORK_COMPLETED, disk=7 if dest_known else 99))
        assert task.destination is not None
        live = {"source": task.source, "destination": task.destination,
                "elsewhere": Unit(vuid=Vuid.make(1, 0, 9), disk_id=8, host="http://n8")}[unit_at]
        units = list(world.volumes[1].units)
        units[0] = live
        world.volumes[1] = world.volumes[1].model_copy(update={"units": units})
        world.fail = {k: v for k, v in ((SetTaskFence, fence), (SwitchUnit, Conflict("reservation superseded")
                                                                 if refused else None)) if v is not None}
        state = elect(world)
        world.calls.clear()
        round_(state, world)
        after = state.tasks[task.task_id]
        released = [c.vuid for c in calls(world, ReleaseChunk) if isinstance(c, ReleaseChunk)]
        case = (unit_at, fence, dest_known, refused)
        if unit_at == "destination" or (unit_at == "source" and fence is None and not refused):
            assert after.state is TaskState.FINISHED and released == [task.source_vuid], case
            assert world.volumes[1].units[0] == task.destination
        elif unit_at == "elsewhere":
            assert after.state is TaskState.FINISHED_IN_ADVANCE and released == [task.destination.vuid], case
        elif fence is NODE_AWAY and dest_known:  # out of reach for a moment: the switch waits
            assert after.state is TaskState.WORK_COMPLETED and not released and task.task_id in state.held_back, case
        else:  # the destination is gone, or the volume refused it: prepared again elsewhere
            assert after.state is TaskState.INITED and after.destination is None and after.redo == 1, case
            assert released == [task.destination.vuid]
            assert after.avoid_disks == ([] if refused and fence is None else [task.destination.disk_id]), case
        assert bool(calls(world, UnlockVolume)) is (not after.open and task_type in rules.LOCKING), case
        assert bool(calls(world, SwitchUnit)) is (unit_at == "source" and fence is None), case


@pytest.mark.parametrize("task_type", [TaskType.DISK_REPAIR, TaskType.MANUAL_MIGRATE])
@pytest.mark.parametrize("why", ["moved", "destination failed", "given back"])
def test_every_outcome_of_a_cancel(task_type: TaskType, why: str) -> None:
    world = World()
    task = seeded(world, prepared(task_type))
    state = elect(world)
    work = acquire(state, world, "w1")
    assert work is not None
    if why == "moved":
        units = list(world.volumes[1].units)
        units[0] = Unit(vuid=Vuid.make(1, 0, 9), disk_id=8, host="http://n8")
        world.volumes[1] = world.volumes[1].model_copy(update={"units": units})
    world.calls.clear()
    go(state, world, TaskCancelled(request=TaskCancel(ref=work.ref, reason=why,
                                                      destination_failed=why == "destination failed"), at=world.at))
    after = state.tasks[task.task_id]
    assert task.task_id not in state.leases and world.kv[task.key] == after
    released = [c.vuid for c in calls(world, ReleaseChunk) if isinstance(c, ReleaseChunk)]
    if why == "moved":
        assert after.state is TaskState.FINISHED_IN_ADVANCE and not released
        assert bool(calls(world, UnlockVolume)) is (task_type in rules.LOCKING)
    elif why == "destination failed":
        assert after.state is TaskState.INITED and released == [work.destination.vuid]
        assert after.avoid_disks == [work.destination.disk_id] and after.redo == 1
    else:
        assert after.state is TaskState.PREPARED and after.reason == why and not released
        assert acquire(state, world, "w2") is None  # held back for cancel_hold
        world.tick(CONFIG.cancel_hold)
        renew(state, world)
        assert acquire(state, world, "w2") is not None


# the round


def test_a_broken_disk_gets_a_task_per_unit_before_it_is_marked_repairing_and_an_earlier_record_wins() -> None:
    world = World()
    state = elect(world)
    earlier = prepared(vid=2)  # written by a holder that did not get to load it
    world.kv[earlier.key] = earlier
    world.disks[1] = world.disks[1].model_copy(update={"status": DiskStatus.BROKEN})
    world.calls.clear()
    round_(state, world)
    order = [type(c) for c in calls(world, CreateTask, SetDiskStatus)]
    assert order == [CreateTask, CreateTask, CreateTask, SetDiskStatus]
    assert world.disks[1].status is DiskStatus.REPAIRING
    assert state.tasks[earlier.task_id] == earlier == world.kv[earlier.key]
    assert sorted(t.state for t in state.tasks.values()) == [TaskState.PREPARED] * 3


def test_a_paused_task_gives_its_volume_back_to_a_waiting_repair() -> None:
    world = World()
    balance = seeded(world, prepared(TaskType.BALANCE, index=1))
    repair = seeded(world, rules.new_task(TaskType.DISK_REPAIR, volume(1), 0, 1000.0))
    state = elect(world)
    world.calls.clear()
    round_(state, world)  # balance is switched off
    after = state.tasks[balance.task_id]
    assert after.state is TaskState.INITED and after.destination is None
    assert balance.destination is not None
    assert [c for c in world.calls if isinstance(c, ReleaseChunk | UnlockVolume | SetSourcesReadonly)] == [
        ReleaseChunk(balance.destination.host, balance.destination.disk_id, balance.destination.vuid),
        UnlockVolume(1), SetSourcesReadonly((balance,), False)]
    assert state.tasks[repair.task_id].state is TaskState.PREPARED


# random runs


def test_random_runs_keep_the_table_written_through_and_workers_fenced() -> None:
    """Rounds, worker calls (current and stale), failing calls, broken disks and switches at random: the table
    is always what the kv holds, a lease is held only on a prepared task, every transition is in the table
    (checked as each record is written), a call is accepted only under the latest hand-out, and a unit is
    switched only once its destination's task fence is closed (checked as the switch is made)."""
    kinds = (PersistTask, CreateTask, AllocUnit, CreateChunk, SetTaskFence, SwitchUnit, ReadUnit, SealSource)
    for seed in range(40):
        rng = random.Random(seed)
        world = World(volumes=4, config={})
        state = elect(world)
        held: list[WorkTask] = []
        for _ in range(80):
            world.fail = {kind: Unavailable("injected") for kind in kinds if rng.random() < 0.05}
            step = rng.random()
            try:
                if step < 0.3:
                    round_(state, world)
                elif step < 0.5 and (work := acquire(state, world, rng.choice(["w1", "w2"]))) is not None:
                    assert world.fences[work.destination.vuid] == work.ref.token
                    held.append(work)
                elif held:
                    _worker_call(state, world, rng.choice(held), rng)
            except RpcError:
                pass
            if rng.random() < 0.05:
                disk = rng.choice(list(world.disks))
                world.disks[disk] = world.disks[disk].model_copy(update={"status": DiskStatus.BROKEN})
            world.tick(rng.uniform(0, 4))
            renew(state, world)
            assert state.tasks == {t.task_id: t for t in world.kv.values()}, seed
            assert all(state.tasks[task_id].state is TaskState.PREPARED for task_id in state.leases), seed


def _worker_call(state: SchedulerState, world: World, work: WorkTask, rng: random.Random) -> None:
    """One call about a task the worker was handed, accepted only if it was its latest hand-out."""
    ref = work.ref
    progress = TaskProgress(ref=ref, done_bytes=1, done_shards=1, total_bytes=2, total_shards=2)
    event = rng.choice([WorkerHeartbeat(ref=ref, at=world.at), TaskReported(progress=progress, at=world.at),
                        TaskCompleted(ref=ref, at=world.at),
                        TaskCancelled(request=TaskCancel(ref=ref, reason="r", destination_failed=rng.random() < 0.5),
                                      at=world.at)])
    before = state.tasks.get(ref.task_id)
    go(state, world, event)
    assert before is not None and before.token == ref.token and before.state is TaskState.PREPARED


def test_a_stale_workers_report_is_refused_and_the_leader_stays_the_leader() -> None:
    """The shell (`Scheduler`) around the state: a worker's report, completion or cancel under the epoch before
    the takeover is refused as fenced, and the leader that refused it stays active and loaded (it used to read its
    own refusal as clustermgr's and stand by). No call is made: the collaborators are never touched (None)."""
    world = World()
    world.at = Instant(time.time(), time.monotonic())  # the shell reads the real clocks
    old = elect(world, OTHER)
    world.disks[1] = world.disks[1].model_copy(update={"status": DiskStatus.BROKEN})
    round_(old, world)
    handed = acquire(old, world, "w1")
    assert handed is not None
    world.tick(0.0)
    new = elect(world)
    assert new.epoch == handed.ref.epoch + 1
    shell = Scheduler(CONFIG, *[cast(Any, None)] * 5)
    shell.state = new
    progress = TaskProgress(ref=handed.ref, done_bytes=1, done_shards=1, total_bytes=2, total_shards=2)

    async def calls_of_the_old_worker() -> None:
        for call in (shell.report(progress), shell.complete(handed.ref),
                     shell.cancel(TaskCancel(ref=handed.ref, reason="stale"))):
            with pytest.raises(Fenced, match="handed out under epoch"):
                await call

    asyncio.run(calls_of_the_old_worker())
    assert shell.active and new.loaded and new.fenced == 3
