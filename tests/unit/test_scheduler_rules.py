"""The scheduler's decisions: task states, preparation and hand-out order, fencing, disk statuses, election."""

from __future__ import annotations

import itertools

import pytest

from blobstore_server.libs.proto.cluster import (
    WRITE_FENCE_MAX,
    WRITE_FENCE_MIN,
    DiskInfo,
    DiskStatus,
    Unit,
    VolumeInfo,
    write_fence_for,
)
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import (
    LeaderRecord,
    TaskRecord,
    TaskRef,
    TaskState,
    disk_progress,
    parse_broken_after,
)
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc import errors
from blobstore_server.services.scheduler import rules
from blobstore_server.services.scheduler.election import Election
from blobstore_server.services.scheduler.rules import BadTransition, Lease


def volume(vid: int, disks: list[int]) -> VolumeInfo:
    units = [Unit(vuid=Vuid.make(vid, i, 1), disk_id=d, host=f"http://n{d}") for i, d in enumerate(disks)]
    return VolumeInfo(vid=vid, code_mode=1, backend="isal", capacity=1 << 30, units=units)


def task(vid: int = 1, index: int = 0, task_type: TaskType = TaskType.DISK_REPAIR, state: TaskState = TaskState.INITED,
         ctime: float = 0.0, destination: Unit | None = None) -> TaskRecord:
    t = rules.new_task(task_type, volume(vid, [1, 2, 3, 4, 5, 6]), index, ctime)
    return t.model_copy(update={"state": state, "destination": destination})


DEST = Unit(vuid=Vuid.make(1, 0, 2), disk_id=9, host="http://n9")
ALL_ON = dict.fromkeys(TaskType, True)


def test_every_state_change_outside_the_table_is_refused() -> None:
    for start, end in itertools.product(TaskState, TaskState):
        t = task(state=start)
        if start is end or end in rules.TASK_TRANSITIONS[start]:
            assert rules.advance(t, end, 5.0).state is end
        else:
            with pytest.raises(BadTransition):
                rules.advance(t, end, 5.0)
    assert rules.advance(task(), TaskState.PREPARED, 7.0, destination=DEST).mtime == 7.0


def test_task_ids_name_the_unit_epoch_so_creating_twice_is_one_task() -> None:
    v = volume(3, [1, 2, 3, 4, 5, 6])
    repair = rules.new_task(TaskType.DISK_REPAIR, v, 2, 1.0).task_id
    assert repair == rules.new_task(TaskType.DISK_REPAIR, v, 2, 9.0).task_id == "disk_repair-3-3-2-1"
    assert rules.new_task(TaskType.DISK_DROP, v, 2, 1.0).task_id != repair


def test_units_on_a_broken_or_dropping_disk_get_one_task_each() -> None:
    volumes = [volume(1, [1, 2, 3, 4, 5, 6]), volume(2, [7, 1, 8, 9, 10, 11]), volume(3, [2, 3, 4, 5, 6, 7])]
    broken = DiskInfo(disk_id=1, host="http://n1", idc="z0", rack="r", path="/d", status=DiskStatus.BROKEN)
    on_disk_1 = rules.units_by_disk(volumes)[1]
    assert [(v.vid, index) for v, index in on_disk_1] == [(1, 0), (2, 1)]
    fresh = rules.units_to_evacuate(broken, on_disk_1, {}, 3.0)
    assert [(t.vid, t.unit_index, t.task_type) for t in fresh] == [(1, 0, TaskType.DISK_REPAIR),
                                                                  (2, 1, TaskType.DISK_REPAIR)]
    assert rules.units_to_evacuate(broken, on_disk_1, {fresh[0].task_id: fresh[0]}, 3.0) == fresh[1:]
    dropping = broken.model_copy(update={"status": DiskStatus.DROPPING})
    assert {t.task_type for t in rules.units_to_evacuate(dropping, on_disk_1, {}, 3.0)} == {TaskType.DISK_DROP}
    for status in (DiskStatus.NORMAL, DiskStatus.REPAIRED, DiskStatus.DROPPED):
        assert rules.units_to_evacuate(broken.model_copy(update={"status": status}), on_disk_1, {}, 3.0) == []


@pytest.mark.parametrize(("status", "silent", "units", "open_tasks", "expected"), [
    (DiskStatus.NORMAL, 5.0, 3, 0, None),  # heard from recently enough
    (DiskStatus.NORMAL, 11.0, 3, 0, DiskStatus.BROKEN),
    (DiskStatus.BROKEN, 99.0, 3, 0, None),  # tasks not created yet (switch off)
    (DiskStatus.BROKEN, 99.0, 3, 3, DiskStatus.REPAIRING),
    (DiskStatus.BROKEN, 99.0, 0, 0, DiskStatus.REPAIRING),  # nothing on it: repairing, then repaired
    (DiskStatus.REPAIRING, 99.0, 1, 0, None),  # a unit left: its task comes next round
    (DiskStatus.REPAIRING, 99.0, 0, 1, None),  # a task still finishing
    (DiskStatus.REPAIRING, 99.0, 0, 0, DiskStatus.REPAIRED),
    (DiskStatus.DROPPING, 0.0, 2, 2, None),
    (DiskStatus.DROPPING, 0.0, 0, 0, DiskStatus.DROPPED),
    (DiskStatus.REPAIRED, 99.0, 0, 0, None),
])
def test_disk_status_follows_silence_tasks_and_units(status: DiskStatus, silent: float, units: int, open_tasks: int,
                                                    expected: DiskStatus | None) -> None:
    disk = DiskInfo(disk_id=1, host="h", idc="z0", rack="r", path="/d", status=status, last_heartbeat=100.0)
    assert rules.next_disk_status(disk, silent, 10.0, units, open_tasks) == expected
    if expected is not None:
        assert expected in {DiskStatus.BROKEN, DiskStatus.REPAIRING, DiskStatus.REPAIRED, DiskStatus.DROPPED}


def test_silence_alone_never_breaks_a_disk_when_off_or_never_heard_from() -> None:
    disk = DiskInfo(disk_id=1, host="h", idc="z0", rack="r", path="/d", last_heartbeat=100.0)
    assert rules.next_disk_status(disk, 1e9, None, 3, 0) is None
    assert rules.next_disk_status(disk.model_copy(update={"last_heartbeat": 0.0}), 1e9, 10.0, 3, 0) is None


def test_preparation_takes_repairs_first_one_task_per_volume_and_respects_switches() -> None:
    tasks = [task(vid=1, task_type=TaskType.BALANCE, ctime=1), task(vid=2, task_type=TaskType.DISK_DROP, ctime=2),
             task(vid=3, ctime=9), task(vid=3, index=1, ctime=3),
             task(vid=4, state=TaskState.PREPARED, destination=DEST), task(vid=4, index=2, ctime=0)]
    chosen = rules.to_prepare(tasks, ALL_ON, 10, {})
    assert [(t.vid, t.unit_index) for t in chosen] == [(3, 1), (2, 0), (1, 0)]  # vid 3 once, vid 4 busy
    assert [(t.vid, t.unit_index) for t in rules.to_prepare(tasks, ALL_ON, 1, {})] == [(3, 1)]
    off = {**ALL_ON, TaskType.DISK_REPAIR: False}
    assert [t.vid for t in rules.to_prepare(tasks, off, 10, {})] == [2, 1]


def test_hand_out_skips_leased_held_back_and_switched_off_tasks() -> None:
    a = task(vid=1, task_type=TaskType.BALANCE, state=TaskState.PREPARED, destination=DEST, ctime=1)
    b = task(vid=2, state=TaskState.PREPARED, destination=DEST, ctime=5)
    c = task(vid=3, state=TaskState.INITED, ctime=0)
    tasks = [a, b, c]
    assert rules.to_hand_out(tasks, {}, {}, ALL_ON, [], 10.0, {}) == b  # repair first
    leases = {b.task_id: Lease("w1", 20.0)}
    assert rules.to_hand_out(tasks, leases, {}, ALL_ON, [], 10.0, {}) == a
    assert rules.to_hand_out(tasks, leases, {}, ALL_ON, [], 20.0, {}) == b  # the lease lapsed
    assert rules.to_hand_out(tasks, leases, {a.task_id: 15.0}, ALL_ON, [], 10.0, {}) is None
    assert rules.to_hand_out(tasks, {}, {}, {**ALL_ON, TaskType.DISK_REPAIR: False}, [], 10.0, {}) == a
    assert rules.to_hand_out(tasks, {}, {}, ALL_ON, [TaskType.BALANCE], 10.0, {}) == a


def test_a_paused_task_gives_its_volume_back_to_a_waiting_repair_once_no_lease_holds_it() -> None:
    balance = task(vid=1, index=2, task_type=TaskType.BALANCE, state=TaskState.PREPARED, destination=DEST)
    drop = task(vid=2, task_type=TaskType.DISK_DROP, state=TaskState.PREPARED, destination=DEST)
    repairs = [task(vid=1), task(vid=2)]
    paused = {**ALL_ON, TaskType.BALANCE: False, TaskType.DISK_DROP: False}
    tasks = [balance, drop, *repairs]
    assert rules.to_give_back(tasks, paused, {}, 10.0) == [balance, drop]
    assert rules.to_give_back(tasks, ALL_ON, {}, 10.0) == []  # switched on: it runs, the repair waits its turn
    assert rules.to_give_back(tasks, {**paused, TaskType.DISK_REPAIR: False}, {}, 10.0) == []
    assert rules.to_give_back([balance, drop], paused, {}, 10.0) == []  # no repair waits
    prepared_repair = repairs[0].model_copy(update={"state": TaskState.PREPARED, "destination": DEST})
    assert rules.to_give_back([balance, prepared_repair], paused, {}, 10.0) == []  # it has its volume already
    leases = {balance.task_id: Lease("w1", 20.0)}
    assert rules.to_give_back(tasks, paused, leases, 10.0) == [drop]  # a worker may still be on it
    assert rules.to_give_back(tasks, paused, leases, 20.0) == [balance, drop]  # its lease lapsed
    given = rules.advance(balance, TaskState.INITED, 30.0, destination=None)
    assert rules.to_prepare([given, repairs[0]], paused, 10, {}) == [repairs[0]]  # and it stays paused


def test_a_volume_margin_counts_its_units_on_lost_disks_against_its_parity() -> None:
    ec3p3 = volume(1, [1, 2, 3, 4, 5, 6]).model_copy(update={"code_mode": 11})
    ec6p3 = volume(2, [1, 7, 8, 9, 10, 11, 12, 13, 14]).model_copy(update={"code_mode": 13})
    untouched = volume(3, [20, 21, 22, 23, 24, 25]).model_copy(update={"code_mode": 11})
    assert rules.volume_margins([ec3p3, ec6p3, untouched], {1, 2}) == {1: 1, 2: 2}
    assert rules.volume_margins([ec3p3, ec6p3], {1, 2, 3, 7}) == {1: 0, 2: 1}
    assert rules.volume_margins([ec3p3], set()) == {}


def test_repairs_of_volumes_closest_to_loss_go_first_and_never_wait_for_room() -> None:
    older = [task(vid=v, ctime=v) for v in (1, 2, 3)]
    critical = task(vid=9, ctime=50)
    margins = {1: 2, 2: 2, 3: 2, 9: 0}
    assert [t.vid for t in rules.to_prepare([*older, critical], ALL_ON, 2, margins)] == [9, 1, 2]
    assert [t.vid for t in rules.to_prepare([*older, critical], ALL_ON, 0, margins)] == [9]  # urgent past the cap
    assert [t.vid for t in rules.to_prepare([*older, critical], ALL_ON, 2, {})] == [1, 2]  # oldest first otherwise
    one_away = task(vid=8, ctime=60)
    chosen = rules.to_prepare([*older, critical, one_away], ALL_ON, 0, {**margins, 8: 1})
    assert [t.vid for t in chosen] == [9, 8]  # margin 0 before margin 1, both past the cap
    balance = task(vid=9, task_type=TaskType.BALANCE, ctime=0)
    assert not rules.is_urgent(balance, margins)  # only a repair restores the margin


def test_the_urgent_lane_takes_only_repairs_of_volumes_at_margin_one_or_less() -> None:
    calm = task(vid=1, state=TaskState.PREPARED, destination=DEST, ctime=1)
    critical = task(vid=2, state=TaskState.PREPARED, destination=DEST, ctime=9)
    margins = {1: 2, 2: 1}
    assert rules.to_hand_out([calm, critical], {}, {}, ALL_ON, [], 10.0, margins) == critical
    assert rules.to_hand_out([calm, critical], {}, {}, ALL_ON, [], 10.0, {}) == calm
    assert rules.to_hand_out([calm], {}, {}, ALL_ON, [], 10.0, margins, urgent_only=True) is None
    assert rules.to_hand_out([calm, critical], {}, {}, ALL_ON, [], 10.0, margins, urgent_only=True) == critical


def test_only_the_holder_of_the_current_units_passes_the_fence() -> None:
    t = task(state=TaskState.PREPARED, destination=DEST)
    ref = TaskRef(task_type=t.task_type, task_id=t.task_id, worker="w1", source_vuid=t.source_vuid,
                  destination_vuid=DEST.vuid)
    assert rules.fence(t, ref, Lease("w1", 10.0), 5.0) is None
    assert rules.fence(t, ref, None, 5.0) is None  # a new scheduler: the worker with the units takes it back
    assert rules.fence(t, ref, Lease("w2", 4.0), 5.0) is None  # the other lease lapsed
    assert "held by w2" in (rules.fence(t, ref, Lease("w2", 10.0), 5.0) or "")
    stale = ref.model_copy(update={"destination_vuid": Vuid.make(1, 0, 3)})
    assert "moves" in (rules.fence(t, stale, Lease("w1", 10.0), 5.0) or "")
    assert "moves" in (rules.fence(t, ref.model_copy(update={"source_vuid": 7}), None, 5.0) or "")
    assert "is work_completed" in (rules.fence(t.model_copy(update={"state": TaskState.WORK_COMPLETED}), ref, None, 5.0)
                                   or "")
    assert "no task" in (rules.fence(None, ref, None, 5.0) or "")


def test_a_hand_out_superseded_by_a_later_one_fails_the_fence_even_with_the_same_units_and_worker() -> None:
    """Two runners of one worker share its name: only the token tells the hand-outs apart."""
    t = task(state=TaskState.PREPARED, destination=DEST).model_copy(update={"token": 3})
    ref = TaskRef(task_type=t.task_type, task_id=t.task_id, worker="w1", source_vuid=t.source_vuid,
                  destination_vuid=DEST.vuid, token=3)
    assert rules.fence(t, ref, Lease("w1", 10.0), 5.0) is None
    for token in (0, 2, 4):
        why = rules.fence(t, ref.model_copy(update={"token": token}), Lease("w1", 10.0), 5.0) or ""
        assert f"was handed out again (token 3, not {token})" in why


def test_only_a_node_that_beat_lately_and_could_not_be_reached_keeps_its_destination() -> None:
    for error, heard_from in itertools.product(
            (errors.Unavailable("timeout"), errors.Unreachable("refused"), errors.ChunkNotFound("gone"),
             errors.DiskNotFound("gone"), errors.Conflict("live"), errors.Internal("disk I/O failed")), (True, False)):
        keeps = isinstance(error, errors.Unavailable) and heard_from
        assert rules.gives_up_destination(error, heard_from) is not keeps, (error, heard_from)


def test_one_holder_at_a_time_and_a_standby_waits_a_whole_ttl_of_silence() -> None:
    a, b = Election("a", 6.0), Election("b", 6.0)
    claim = a.decide(None, 0.0)
    assert claim is not None and claim.record == LeaderRecord(host="a", term=1)
    a.won(claim, 0.0)
    record = claim.record
    assert b.decide(record, 1.0) is None and not b.active(1.0)
    renewal = a.decide(record, 2.0)
    assert renewal is not None and renewal.record.term == 2
    a.won(renewal, 2.0)
    record = renewal.record
    assert b.decide(record, 3.0) is None  # changed: b starts counting again
    assert b.decide(record, 8.9) is None
    assert a.active(7.9) and not a.active(8.0)  # a's own deadline passes before b may claim
    takeover = b.decide(record, 9.0)
    assert takeover is not None and takeover == type(takeover)(record, LeaderRecord(host="b", term=3, epoch=2))
    b.won(takeover, 9.0)
    assert b.active(9.5) and b.leader == "b"
    assert a.decide(takeover.record, 9.6) is None and not a.active(9.6) and a.leader == "b"


def test_a_source_takes_no_write_once_sealed_or_its_nodes_write_fence_is_waited_out() -> None:
    disk = DiskInfo(disk_id=1, host="h", idc="z", rack="r", path="/d", write_fence_s=20.0)
    wait = 20.0 * rules.FENCE_SLACK + rules.FENCE_PAD
    assert rules.source_fenced(disk, True, 0.0, 0.0)
    assert not rules.source_fenced(disk, False, wait, wait)  # a node answered just before the silence may write on
    assert rules.source_fenced(disk, False, wait + 0.1, 0.0)  # silent: its own fence has shut
    assert rules.source_fenced(disk, False, 0.0, wait + 0.1)  # beating, but every answer since says "broken"
    longer = disk.model_copy(update={"write_fence_s": 300.0})  # an earlier answer's longer fence still open
    assert not rules.source_fenced(longer, False, wait + 0.1, wait + 0.1)


def test_write_fence_is_half_the_broken_after_within_its_bounds() -> None:
    assert write_fence_for(None) == WRITE_FENCE_MAX
    assert write_fence_for(600.0) == 300.0 and write_fence_for(120.0) == 60.0
    assert write_fence_for(3.0) == WRITE_FENCE_MIN and write_fence_for(1e6) == WRITE_FENCE_MAX


def test_broken_after_setting() -> None:
    assert parse_broken_after(None) is None and parse_broken_after("off") is None
    assert parse_broken_after("30") == 30.0
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(ValueError):
            parse_broken_after(bad)


def test_disk_progress_rate_and_eta() -> None:
    moving = task(state=TaskState.PREPARED, destination=DEST, ctime=100.0).model_copy(
        update={"worker": "w", "done_bytes": 300, "total_bytes": 1000, "done_shards": 3, "total_shards": 10})
    done = task(vid=2, state=TaskState.FINISHED, ctime=100.0).model_copy(
        update={"worker": "w", "done_bytes": 700, "total_bytes": 700})
    progress = disk_progress([moving, done], 1, 110.0)
    assert (progress.tasks, progress.finished, progress.done_bytes, progress.total_bytes) == (2, 1, 1000, 1700)
    assert progress.bytes_per_sec == 100.0 and progress.eta_seconds == 7.0
    waiting = task(vid=3, ctime=105.0)
    assert disk_progress([moving, done, waiting], 1, 110.0).eta_seconds is None  # one unit not sized yet


def disks(count: int, idc: str = "z0") -> list[DiskInfo]:
    return [DiskInfo(disk_id=d, host=f"http://n{d}", idc=idc, rack="r", path="/d") for d in range(1, count + 1)]


def test_balance_moves_the_fullest_disks_biggest_unit_to_the_emptiest_disk_and_stops() -> None:
    # disks 1-6 hold a unit of each of 4 volumes; disk 7 joined empty
    volumes = [volume(v, [1, 2, 3, 4, 5, 6]).model_copy(update={"used": 100 * v}) for v in range(1, 5)]
    pool = disks(7)
    moves = []
    for round_ in range(20):
        t = rules.plan_balance(pool, rules.units_by_disk(volumes), [], float(round_), threshold=2, per_hour=100)
        if t is None:
            break
        moves.append(t)
        assert t.task_type is TaskType.BALANCE and t.target_disk == 7
        v = volumes[t.vid - 1]
        units = list(v.units)
        units[t.unit_index] = Unit(vuid=Vuid.make(v.vid, t.unit_index, 2), disk_id=7, host="http://n7")
        volumes[t.vid - 1] = v.model_copy(update={"units": units})
    counts = rules.units_per_disk(pool, rules.units_by_disk(volumes))
    assert max(counts.values()) - min(counts.values()) < 2  # stopped once even
    assert counts[7] == 3 and len(moves) == 3
    assert moves[0].vid == 4  # the volume holding the most data first


def test_balance_waits_for_repairs_respects_the_hourly_cap_and_the_threshold() -> None:
    volumes = rules.units_by_disk(volume(v, [1, 2, 3, 4, 5, 6]) for v in range(1, 5))
    pool = disks(7)
    assert rules.plan_balance(pool, volumes, [task(vid=9)], 0.0, 2, 100) is None  # an open repair
    recent = [task(vid=9, task_type=TaskType.BALANCE, state=TaskState.FINISHED, ctime=100.0 + i) for i in range(3)]
    assert rules.plan_balance(pool, volumes, recent, 200.0, 2, 3) is None
    assert rules.plan_balance(pool, volumes, recent, 200.0 + 3600, 2, 3) is not None  # an hour later
    assert rules.plan_balance(pool, volumes, [], 0.0, 5, 100) is None  # 4 vs 0 is within a threshold of 5
    assert rules.plan_balance(disks(6) + disks(7, "z1")[6:], volumes, [], 0.0, 2, 100) is None  # other AZ


def test_inspection_finds_missing_shards_and_lost_blobs_and_leaves_deletes_alone() -> None:
    n = "normal"
    listings = [{1: n, 2: n, 3: n, 4: "mark_deleted"}, {1: n, 3: n}, {1: n, 4: n}, {1: n, 2: n}]
    finding = rules.inspect_volume(listings, 2)
    assert finding.repairs == {2: [1, 2], 3: [2, 3]}
    assert finding.lost == []
    assert rules.inspect_volume(listings, 3).lost == [2, 3]
    assert rules.inspect_volume([{}, {}, {}], 2) == rules.InspectFinding({}, [])
