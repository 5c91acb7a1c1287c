"""The clustermgr state machine driven by commands alone, as Raft would apply them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.cluster import DiskStatus, Unit, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import (
    DiskAdd,
    DiskBeat,
    RetainItem,
    UndeleteSlice,
    parse_undelete_looks,
    undelete_looks,
)
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import BROKEN_AFTER_KEY
from blobstore_server.libs.rpc import errors
from blobstore_server.services.clustermgr.commands.disks import DiskAddCmd, DiskHeartbeatCmd, DiskSetCmd
from blobstore_server.services.clustermgr.commands.keys import (
    ConfigSet,
    KvCas,
    KvDelete,
    KvSet,
    ScopeAlloc,
    UndeleteAdd,
)
from blobstore_server.services.clustermgr.commands.services import ServiceHeartbeat, ServiceRegisterCmd
from blobstore_server.services.clustermgr.commands.table import COMMANDS, encode
from blobstore_server.services.clustermgr.commands.units import (
    UnitAllocCmd,
    UnitReleaseCmd,
    UnitUpdateCmd,
    dead_for_good,
)
from blobstore_server.services.clustermgr.commands.volumes import (
    VolumeAllocCmd,
    VolumeCommitted,
    VolumeCreate,
    VolumeFull,
    VolumeLock,
    VolumeRelease,
    VolumeRetainCmd,
    VolumeUnlock,
)
from blobstore_server.services.clustermgr.machine import ClusterMachine
from blobstore_server.services.clustermgr.sessions import MAX_DROPS, LoggedSession
from tests.support.clustermgr_state import Driver, add_disks, create_volume, disk, ec3p3_units


def test_every_command_name_ever_logged_is_in_the_table_with_a_result_model() -> None:
    assert set(COMMANDS) == {
        "scope_alloc", "disk_add", "disk_heartbeat", "disk_set", "volume_create", "volume_alloc", "volume_retain",
        "volume_release", "volume_lock", "volume_unlock", "volume_unit_alloc", "volume_unit_update",
        "service_register", "service_heartbeat", "service_unregister", "config_set", "config_delete", "kv_set",
        "kv_delete", "kv_cas", "volume_unit_release", "volume_full", "volume_committed", "undelete_add"}
    for op, entry in COMMANDS.items():
        assert entry.model.op == op and issubclass(entry.model.result_type, BaseModel)


def test_scopes_are_monotonic_and_survive_restart(tmp_path: Path) -> None:
    state = ClusterMachine(tmp_path / "s")
    cm = Driver(state)
    assert cm(ScopeAlloc(name="bid", count=10)).model_dump() == {"name": "bid", "start": 1, "end": 10}
    assert cm(ScopeAlloc(name="bid", count=5)).start == 11
    with pytest.raises(ValidationError):  # the route's body is the command: a bad count never reaches the log
        ScopeAlloc(name="bid", count=0)
    with pytest.raises(errors.BadRequest, match="malformed"):  # and one in the log anyway is refused everywhere
        cm(ScopeAlloc.model_construct(name="bid", count=0))
    state.close()
    state = ClusterMachine(tmp_path / "s")
    assert state.applied_index() == 3
    assert Driver(state)(ScopeAlloc(name="bid", count=1)).start == 16
    state.close()


def test_disk_ids_must_be_allocated_and_never_reused(cm: Driver) -> None:
    with pytest.raises(errors.BadRequest, match="never allocated"):
        cm(DiskAddCmd(disk=disk(1, "http://h")))
    cm(ScopeAlloc(name="disk_id", count=1))
    cm(DiskAddCmd(disk=disk(1, "http://h")))
    before = cm.state.checksum()
    with pytest.raises(errors.Conflict, match="already registered"):
        cm(DiskAddCmd(disk=disk(1, "http://other")))
    assert cm.state.checksum() == before
    assert cm.state.disk(1).host == "http://h"


def test_disk_status_follows_the_transition_table(cm: Driver) -> None:
    add_disks(cm)
    cm(DiskSetCmd(disk_id=1, status=DiskStatus.BROKEN))
    with pytest.raises(errors.Conflict, match="from broken to normal"):
        cm(DiskSetCmd(disk_id=1, status=DiskStatus.NORMAL))
    cm(DiskSetCmd(disk_id=1, status=DiskStatus.REPAIRING))
    cm(DiskSetCmd(disk_id=1, status=DiskStatus.REPAIRED))
    cm(DiskSetCmd(disk_id=2, readonly=True))
    assert cm.state.disk(2).readonly and not cm.state.disk(2).writable
    cm.now = 2000.0
    cm(DiskHeartbeatCmd(disks=[DiskBeat(disk_id=3, size=100, free=42)]))
    assert (cm.state.disk(3).free, cm.state.disk(3).last_heartbeat) == (42, 2000.0)
    cm(DiskHeartbeatCmd(disks=[DiskBeat(disk_id=3, size=100, free=40, trash_bytes=9, scrub_late_s=3600.0)]))
    assert (cm.state.disk(3).trash_bytes, cm.state.disk(3).scrub_late_s) == (9, 3600.0)


def test_a_heartbeat_answers_the_disks_status_and_records_the_longest_write_fence_that_may_be_open(cm: Driver) -> None:
    add_disks(cm)
    cm(DiskSetCmd(disk_id=2, status=DiskStatus.BROKEN))
    beat = DiskHeartbeatCmd(disks=[DiskBeat(disk_id=1, size=100, free=1), DiskBeat(disk_id=2, size=100, free=1)])
    answer = cm(beat)
    assert answer.statuses == {1: DiskStatus.NORMAL, 2: DiskStatus.BROKEN}
    assert answer.write_fence_s == cm.state.disk(1).write_fence_s == 300.0  # no disk_broken_after: the longest
    cm(ScopeAlloc(name="disk_id", count=1))
    cm(ConfigSet(key=BROKEN_AFTER_KEY, value="100"))
    assert cm(DiskAddCmd(disk=disk(7, "http://h7"))).write_fence_s == 50.0  # never answered: nothing older open
    cm(ConfigSet(key=BROKEN_AFTER_KEY, value="60"))
    cm.now += 10.0
    assert cm(beat).write_fence_s == 30.0  # the node is told the new fence at once...
    assert cm.state.disk(1).write_fence_s == 290.0  # ...but the last answer it got may have been the old one
    cm.now += 200.0
    cm(beat)
    assert cm.state.disk(1).write_fence_s == 90.0  # what is left of the old one
    cm.now += 100.0
    cm(beat)
    assert cm.state.disk(1).write_fence_s == 30.0  # every older fence has shut


def test_volume_create_refuses_bad_placements(cm: Driver) -> None:
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=3))
    units = ec3p3_units(1)
    units[1] = units[1].model_copy(update={"disk_id": 1})
    with pytest.raises(errors.Conflict, match="two units on one disk"):
        cm(VolumeCreate(vid=1, code_mode=CodeMode.EC3P3, backend="isal", units=units, capacity=1))
    with pytest.raises(errors.BadRequest, match="never allocated"):
        create_volume(cm, 9)
    with pytest.raises(errors.BadRequest, match="unknown code mode number 99"):
        cm.raw(_old_entry("volume_create", cm.now, vid=1, code_mode=99, backend="isal",
                          units=[u.model_dump() for u in ec3p3_units(1)], capacity=1))
    with pytest.raises(errors.NotFound):
        cm.state.volume(1)
    created = create_volume(cm, 1)
    assert created.status == VolumeStatus.IDLE and len(created.units) == 6
    with pytest.raises(errors.Conflict, match="already exists"):
        create_volume(cm, 1)


def test_six_p6_needs_three_azs(cm: Driver) -> None:
    add_disks(cm, azs=1, hosts=12)
    cm(ScopeAlloc(name="vid", count=1))
    units = [Unit(vuid=Vuid.make(1, i, 1), disk_id=i + 1, host="h") for i in range(12)]
    with pytest.raises(errors.Conflict, match="3 distinct AZs"):
        cm(VolumeCreate(vid=1, code_mode=CodeMode.EC6P6, backend="isal", units=units, capacity=1))


def test_leases_are_exclusive_renewable_and_lapse(cm: Driver) -> None:
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=2))
    create_volume(cm, 1)
    create_volume(cm, 2)

    def alloc(holder: str, count: int) -> list[int]:
        got = cm(VolumeAllocCmd(code_mode=CodeMode.EC3P3, holder=holder, count=count, lease_ttl=10))
        return [v.vid for v in got.volumes]

    assert alloc("a1", 1) == [1]
    assert alloc("a2", 5) == [2]  # never the volume a1 holds
    assert alloc("a3", 5) == []
    answer = cm(VolumeRetainCmd(holder="a1", lease_ttl=10, volumes=[RetainItem(vid=1, used=50), RetainItem(vid=2)]))
    assert [r.vid for r in answer.retained] == [1]
    assert answer.refused[0].vid == 2
    assert cm.state.volume(1).used == 50
    cm.now += 100  # every lease lapses
    lapsed = cm(VolumeRetainCmd(holder="a1", lease_ttl=10, volumes=[RetainItem(vid=1)]))
    assert "lapsed" in lapsed.refused[0].reason
    assert alloc("a3", 1) == [1]
    cm(VolumeRelease(vid=1, holder="a3"))
    assert cm.state.volume(1).status == VolumeStatus.IDLE


def test_a_volume_found_full_loses_its_lease_and_is_never_leased_again(cm: Driver) -> None:
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=3))
    for vid in (1, 2, 3):
        create_volume(cm, vid)

    def alloc(holder: str) -> list[int]:
        got = cm(VolumeAllocCmd(code_mode=CodeMode.EC3P3, holder=holder, count=5, lease_ttl=10, min_free=4096))
        return [v.vid for v in got.volumes]

    assert alloc("a1") == [1, 2, 3]
    full = cm(VolumeFull(vid=1))
    assert (full.used, full.free, full.status, full.lease_holder) == (1 << 30, 0, VolumeStatus.IDLE, "")
    assert cm(VolumeFull(vid=1)) == full  # idempotent
    renewed = cm(VolumeRetainCmd(holder="a1", lease_ttl=10, volumes=[RetainItem(vid=1), RetainItem(vid=2)]))
    assert [r.vid for r in renewed.refused] == [1] and [r.vid for r in renewed.retained] == [2]
    assert alloc("a2") == []  # idle, but full
    cm(VolumeLock(vid=3))
    assert cm(VolumeFull(vid=3)).status == VolumeStatus.LOCK  # a unit moving keeps its lock
    with pytest.raises(errors.NotFound):
        cm(VolumeFull(vid=9))


def test_whether_a_volume_was_created_is_read_in_log_order(cm: Driver) -> None:
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=1))
    assert cm(VolumeCommitted(vid=1)).committed is False
    create_volume(cm, 1)
    assert cm(VolumeCommitted(vid=1)).committed is True


def test_a_restarted_holder_reclaims_its_own_leases_and_nobody_elses(cm: Driver) -> None:
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=3))
    for vid in (1, 2, 3):
        create_volume(cm, vid)

    def alloc(holder: str, reclaim: bool = False) -> list[int]:
        got = cm(VolumeAllocCmd(code_mode=CodeMode.EC3P3, holder=holder, count=5, lease_ttl=10,
                                reclaim=reclaim))
        return [v.vid for v in got.volumes]

    assert alloc("a1") == [1, 2, 3]
    cm(VolumeRelease(vid=3, holder="a1"))
    assert alloc("a2") == [3]
    assert alloc("a1") == []  # without reclaim a holder's own leases are not handed out again
    cm.now += 5
    assert alloc("a1", reclaim=True) == [1, 2]  # a2's lease stays a2's
    assert cm.state.volume(1).lease_expiry == cm.now + 10 and cm.state.volume(1).lease_holder == "a1"


def test_unit_moves_bump_the_epoch_and_refuse_stale_updates(cm: Driver) -> None:
    add_disks(cm, hosts=8)
    cm(ScopeAlloc(name="vid", count=1))
    create_volume(cm, 1)
    cm(VolumeLock(vid=1))
    with pytest.raises(errors.Conflict, match="already holds a unit"):
        cm(UnitAllocCmd(vid=1, index=0, disk_id=2))
    unit = cm(UnitAllocCmd(vid=1, index=0, disk_id=7))
    assert Vuid(unit.vuid).epoch() == 2
    newer = cm(UnitAllocCmd(vid=1, index=0, disk_id=8))
    assert Vuid(newer.vuid).epoch() == 3
    with pytest.raises(errors.Conflict, match="not the reserved move"):
        cm(UnitUpdateCmd(vid=1, index=0, vuid=unit.vuid, disk_id=7))
    with pytest.raises(errors.Conflict, match="still moves"):
        cm(VolumeUnlock(vid=1))
    volume = cm(UnitUpdateCmd(vid=1, index=0, vuid=newer.vuid, disk_id=8))
    assert volume.units[0].disk_id == 8 and volume.pending_units == {}
    cm(VolumeUnlock(vid=1))
    assert cm.state.volume(1).status == VolumeStatus.IDLE


def test_releasing_a_reserved_unit_drops_the_reservation_and_its_epoch_is_never_reissued(cm: Driver) -> None:
    add_disks(cm, hosts=8)
    cm(ScopeAlloc(name="vid", count=1))
    create_volume(cm, 1)
    cm(VolumeLock(vid=1))
    given_up = cm(UnitAllocCmd(vid=1, index=0, disk_id=7))
    live = cm.state.volume(1).units[0].vuid
    with pytest.raises(errors.Conflict, match="live"):
        cm(UnitReleaseCmd(vid=1, vuid=live))
    volume = cm(UnitReleaseCmd(vid=1, vuid=given_up.vuid))
    assert volume.pending_units == {} and cm.state.volume(1).units[0].vuid == live
    cm(VolumeUnlock(vid=1))  # nothing moves any more: the volume can take writes again
    assert cm.state.volume(1).status == VolumeStatus.IDLE
    cm(VolumeLock(vid=1))
    again = cm(UnitAllocCmd(vid=1, index=0, disk_id=7))
    assert Vuid(again.vuid).epoch() == Vuid(given_up.vuid).epoch() + 1  # the given-up chunk's writers stay fenced
    before = cm.state.checksum()
    assert cm(UnitReleaseCmd(vid=1, vuid=given_up.vuid)).pending_units == {0: again}  # an older one: no effect
    assert cm.state.checksum() == before
    with pytest.raises(errors.Conflict, match="not the reserved move"):
        cm(UnitUpdateCmd(vid=1, index=0, vuid=given_up.vuid, disk_id=7))
    assert cm(UnitUpdateCmd(vid=1, index=0, vuid=again.vuid, disk_id=7)).dropped_epochs == {}


def test_a_release_ticket_is_only_for_a_unit_dead_for_good(cm: Driver) -> None:
    """Dead for good: issued, and neither live nor the reserved move; an epoch not issued yet may still live."""
    add_disks(cm, hosts=8)
    cm(ScopeAlloc(name="vid", count=1))
    create_volume(cm, 1)
    cm(VolumeLock(vid=1))
    live = cm.state.volume(1).units[0].vuid
    moving = cm(UnitAllocCmd(vid=1, index=0, disk_id=7))
    volume = cm.state.volume(1)
    assert not dead_for_good(volume, live) and not dead_for_good(volume, moving.vuid)
    assert not dead_for_good(volume, Vuid.make(1, 0, 5))  # not issued yet
    assert not dead_for_good(volume, Vuid.make(2, 0, 1))  # another volume's
    assert not dead_for_good(volume, Vuid.make(1, 40, 1))  # no such unit
    with pytest.raises(errors.BadRequest, match="reserved on disk 7"):
        cm(UnitReleaseCmd(vid=1, vuid=moving.vuid, disk_id=8))
    volume = cm(UnitReleaseCmd(vid=1, vuid=moving.vuid, disk_id=7))
    assert dead_for_good(volume, moving.vuid) and not dead_for_good(volume, Vuid.make(1, 0, 3))
    again = cm(UnitAllocCmd(vid=1, index=0, disk_id=7))
    volume = cm(UnitUpdateCmd(vid=1, index=0, vuid=again.vuid, disk_id=7))
    assert dead_for_good(volume, live) and dead_for_good(volume, moving.vuid) and not dead_for_good(volume, again.vuid)


def test_kv_compare_and_set(cm: Driver) -> None:
    cm(KvCas(key="leader", expected=None, value="s1"))
    with pytest.raises(errors.Conflict):
        cm(KvCas(key="leader", expected=None, value="s2"))
    cm(KvCas(key="leader", expected="s1", value="s2"))
    cm(KvSet(key="task/1", value="x"))
    assert cm.state.kv_list("task/") == {"task/1": "x"}
    cm(KvCas(key="leader", expected="s2", value=None))
    assert cm.state.kv_get("leader") is None


def test_kv_listing_pages_in_key_order_and_stays_inside_the_prefix(cm: Driver) -> None:
    for i in range(25):
        cm(KvSet(key=f"task/{i:03d}", value=str(i)))
    cm(KvSet(key="tasl", value="next prefix"))
    cm(KvSet(key="task", value="the prefix itself"))
    seen: list[str] = []
    after = ""
    while page := cm.state.kv_list("task/", after, 10):
        seen += page
        after = next(reversed(page))
    assert seen == [f"task/{i:03d}" for i in range(25)]
    assert cm.state.kv_list("task/", "task/023") == {"task/024": "24"}
    assert cm.state.kv_list("task/", "zzz") == {}


def test_undelete_records_cover_their_slices_and_are_collected_after_their_keep(cm: Driver) -> None:
    def undelete(*slices: tuple[int, int, int], keep: float = 100.0) -> float:
        pieces = [UndeleteSlice(vid=vid, min_bid=low, count=count) for vid, low, count in slices]
        return float(cm(UndeleteAdd(slices=pieces, keep=keep)).at)

    assert cm.state.undeleted_at(7, 10) is None
    first = undelete((7, 10, 3), (70, 10, 1))
    assert first == cm.now  # the leader's clock, as the log carries it
    assert [cm.state.undeleted_at(7, bid) for bid in (9, 10, 12, 13)] == [None, first, first, None]
    assert cm.state.undeleted_at(70, 10) == first and cm.state.undeleted_at(70, 11) is None
    assert cm.state.undeleted_at(77, 10) is None  # another volume whose id starts the same
    cm.now += 50
    again = undelete((7, 10, 3))  # the same object again: its record moves on
    assert cm.state.undeleted_at(7, 11) == again
    cm.now += 60  # the first record of volume 70 is past its keep; the next undelete collects it
    undelete((8, 0, 1))
    assert set(cm.state.undelete_records()) == {"undelete/7/10", "undelete/8/0"}
    cm.now += 1000
    undelete((9, 5, 2), keep=10)
    assert set(cm.state.undelete_records()) == {"undelete/9/5"}
    assert cm.state.kv_list("undelete/").keys() == {"undelete/9/5"}  # plain kv, listed as any key
    blobs = [(9, 5), (9, 6), (1, 2)]
    assert parse_undelete_looks(**undelete_looks(blobs)) == blobs  # what /undelete/get asks, and how it is read
    for vids, bids in (("9.9", "5"), ("9", "x"), ("", "5"), (".".join(["1"] * 257), ".".join(["1"] * 257))):
        with pytest.raises(errors.BadRequest):
            parse_undelete_looks(vids, bids)


def test_services_and_config(cm: Driver) -> None:
    cm(ServiceRegisterCmd(name="mqproxy", host="http://m1", idc="z0", ttl=5))
    cm.now += 10
    assert not next(cm.state.services("mqproxy")).alive(cm.now)
    cm(ServiceHeartbeat(name="mqproxy", host="http://m1"))
    assert next(cm.state.services("mqproxy")).alive(cm.now)
    with pytest.raises(errors.NotFound):
        cm(ServiceHeartbeat(name="mqproxy", host="http://nope"))
    cm(ConfigSet(key="balance", value="false"))
    assert cm.state.configs() == {"balance": "false"}


def test_refused_and_malformed_commands_change_nothing_but_the_index(cm: Driver) -> None:
    add_disks(cm)
    before = cm.state.checksum()
    with pytest.raises(errors.BadRequest, match="unknown command"):
        cm.raw(b'{"op":"drop_everything","now":1,"args":{}}')
    with pytest.raises(errors.BadRequest, match="malformed"):
        cm.raw(b'{"op":"disk_set","now":1,"args":{}}')
    with pytest.raises(errors.BadRequest, match="malformed"):
        cm.raw(b"not json")
    assert cm.state.checksum() == before
    assert cm.state.applied_index() == cm.index


def test_snapshot_restore_gives_an_equal_checksum(tmp_path: Path, cm: Driver) -> None:
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=1))
    create_volume(cm, 1)
    cm.state.snapshot(tmp_path / "snap")
    other = ClusterMachine(tmp_path / "other")
    try:
        other.restore(tmp_path / "snap")
        assert other.checksum() == cm.state.checksum()
        assert other.applied_index() == cm.index
        assert other.volume(1) == cm.state.volume(1)
    finally:
        other.close()


def test_the_volume_and_disk_scans_show_exactly_what_the_store_holds(tmp_path: Path, cm: Driver) -> None:
    """Scans read disks and volumes held parsed in memory: a write shows once its batch is written (never if
    it is dropped, as a refused command's is), in key order, and a restore brings back the snapshot's."""
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=3))
    create_volume(cm, 3)
    cm.state.snapshot(tmp_path / "snap")
    create_volume(cm, 1)
    assert [v.vid for v in cm.state.volumes()] == [1, 3]
    batch = cm.state.kv.batch()
    cm.state.put_volume(batch, cm.state.volume(1).model_copy(update={"used": 5}))
    cm.state.put_disk(batch, cm.state.disk(2).model_copy(update={"free": 7}))
    assert [(v.vid, v.used) for v in cm.state.volumes()] == [(1, 0), (3, 0)]
    assert [d.free for d in cm.state.disks()][:2] == [100, 100]
    cm.state.kv.write(batch)
    assert [(v.vid, v.used) for v in cm.state.volumes()] == [(1, 5), (3, 0)]
    assert [d.free for d in cm.state.disks()][:2] == [100, 7]
    stored = [VolumeInfo.model_validate_json(raw) for _, raw in cm.state.kv.items("volume")]
    assert list(cm.state.volumes()) == stored
    assert all(a is b for a, b in zip(cm.state.volumes(), cm.state.volumes(), strict=True))  # parsed once, not per scan
    mark = cm.index
    cm(VolumeLock(vid=3))
    assert [v.vid for v in cm.state.volumes_changed_since(mark)] == [3]  # what a reader at `mark` lacks
    assert [v.vid for v in cm.state.volumes_changed_since(0)] == [1, 3]
    cm.state.restore(tmp_path / "snap")
    assert [v.vid for v in cm.state.volumes()] == [3]
    snapshot_index = cm.state.applied_index()
    assert [v.vid for v in cm.state.volumes_changed_since(snapshot_index - 1)] == [3]  # loaded: as of the snapshot
    assert list(cm.state.volumes_changed_since(snapshot_index)) == []


def session(client: str, seq: int, acked: int | None = None, ttl: float = 600, limit: int = 100) -> LoggedSession:
    return LoggedSession(client=client, seq=seq, acked=seq - 1 if acked is None else acked, ttl=ttl, limit=limit)


def test_a_retried_command_gets_its_first_answer_and_is_applied_once(cm: Driver) -> None:
    first = cm(ScopeAlloc(name="bid", count=10), session("a", 1, 0))
    assert cm(ScopeAlloc(name="bid", count=10), session("a", 1, 0)) == first  # the reply was lost: a retry
    assert cm(ScopeAlloc(name="bid", count=10), session("a", 2, 0)).start == first.end + 1  # not wasted
    cas = KvCas(key="lease", expected=None, value="s1")
    assert cm(cas, session("a", 3, 2)).value == "s1"
    assert cm(cas, session("a", 3, 2)).value == "s1"  # its own win, not a Conflict
    with pytest.raises(errors.Conflict, match="expected None"):
        cm(cas, session("b", 1))  # another client did lose
    cm(KvSet(key="lease", value="gone"))  # no session (curl): applied as is
    with pytest.raises(errors.Conflict):
        cm(KvCas(key="lease", expected="s1", value="s2"), session("b", 2))
    cm(KvSet(key="lease", value="s1"))
    with pytest.raises(errors.Conflict):  # a refusal is an answer too: the retry gets the same one
        cm(KvCas(key="lease", expected="s1", value="s2"), session("b", 2))
    assert cm.state.kv_get("lease") == "s1" and cm.state.sessions() == 2


def test_acknowledged_answers_are_forgotten_and_a_stale_duplicate_is_refused(cm: Driver) -> None:
    cm(ScopeAlloc(name="bid", count=1), session("a", 1, 0))
    cm(ScopeAlloc(name="bid", count=1), session("a", 2, 0))  # both in flight at once
    assert cm(ScopeAlloc(name="bid", count=1), session("a", 1, 0)).start == 1
    cm(ScopeAlloc(name="bid", count=1), session("a", 3, 2))  # 1 and 2 were answered
    before = cm.state.checksum()
    with pytest.raises(errors.Conflict, match="older than the ones it acknowledged"):
        cm(ScopeAlloc(name="bid", count=1), session("a", 2, 1))  # a duplicate that arrives late
    assert cm.state.checksum() == before and cm.state.scope("bid") == 3
    assert [k for k, _ in cm.state.kv.items("session") if k.startswith(b"ra/")] == [b"ra/%016x" % 3]


def test_the_session_table_is_bounded_and_expires_by_the_leaders_clock(cm: Driver) -> None:
    for i in range(20):  # short-lived clients: one command each
        cm.now += 1
        cm(KvSet(key=f"k{i}", value="x"), session(f"client-{i}", 1, limit=5))
    assert cm.state.sessions() == 5
    assert cm(KvSet(key="k19", value="y"), session("client-19", 1, limit=5)).value == "x"  # still known
    cm.now += 601  # every session idles past the ttl; at most MAX_DROPS go per command
    cm(KvSet(key="new", value="x"), session("new", 1))
    assert cm.state.sessions() == 1 and MAX_DROPS >= 5
    ids = {k.partition(b"/")[2] for k, _ in cm.state.kv.items("session") if k.startswith(b"t")}
    assert ids == {b"new"}


def test_sessions_are_in_snapshots_and_in_the_checksum(tmp_path: Path, cm: Driver) -> None:
    plain = Driver(ClusterMachine(tmp_path / "plain"))
    try:
        got = cm(ScopeAlloc(name="bid", count=5), session("a", 1))
        plain(ScopeAlloc(name="bid", count=5))
        assert cm.state.checksum() != plain.state.checksum()  # replicas compare their session tables too
        cm.state.snapshot(tmp_path / "snap")
        plain.state.restore(tmp_path / "snap")
        plain.index = cm.index
        assert plain(ScopeAlloc(name="bid", count=5), session("a", 1)) == got  # the restored copy knows it
        assert cm(ScopeAlloc(name="bid", count=5), session("a", 1)) == got
        assert plain.state.checksum() == cm.state.checksum()
    finally:
        plain.state.close()


def _old_entry(op: str, now: float, **args: object) -> bytes:
    """A log entry exactly as clustermgr wrote it before commands were typed (name + kwargs)."""
    return json.dumps({"op": op, "now": now, "args": args}, separators=(",", ":")).encode()


def test_a_log_written_before_typed_commands_replays_to_the_same_state(tmp_path: Path) -> None:
    units = [{"vuid": int(Vuid.make(1, i, 1)), "disk_id": i + 1, "host": f"http://h{i}"} for i in range(6)]
    old_log = [
        _old_entry("scope_alloc", 1.0, name="disk_id", count=7),
        *(_old_entry("disk_add", 2.0, disk={"disk_id": i + 1, "host": f"http://h{i}", "idc": "z0", "rack": "r0",
                                            "path": "/d", "size": 100, "free": 90, "max_chunks": 1024})
          for i in range(7)),
        _old_entry("disk_heartbeat", 3.0, disks=[{"disk_id": 1, "size": 100, "free": 80, "chunks": 1}]),
        _old_entry("scope_alloc", 4.0, name="vid", count=1),
        _old_entry("kv_set", 4.5, key="volume_intent/1", value=json.dumps({"vid": 1, "units": units})),
        _old_entry("volume_create", 5.0, vid=1, code_mode=int(CodeMode.EC3P3), backend="isal", units=units,
                   capacity=1 << 30),
        _old_entry("kv_delete", 5.5, key="volume_intent/1"),
        _old_entry("volume_alloc", 6.0, code_mode=int(CodeMode.EC3P3), holder="a", count=1, lease_ttl=30.0),
        _old_entry("volume_retain", 7.0, holder="a", lease_ttl=30.0, volumes=[{"vid": 1, "used": 4096}]),
        _old_entry("disk_set", 8.0, disk_id=2, status="broken", readonly=None),
        _old_entry("service_register", 9.0, name="worker", host="http://w", idc="", ttl=10.0),
        _old_entry("service_heartbeat", 9.5, name="worker", host="http://w"),
        _old_entry("config_set", 10.0, key="code_mode_policy", value='[{"code_mode": "EC3P3"}]'),
        _old_entry("kv_cas", 11.0, key="lease", expected=None, value="s1"),
        _old_entry("volume_lock", 12.0, vid=1),
        _old_entry("volume_unit_alloc", 13.0, vid=1, index=1, disk_id=7),
        _old_entry("disk_set", 13.5, disk_id=1, status=None, readonly=True),
    ]
    old = Driver(ClusterMachine(tmp_path / "old"))
    for entry in old_log:
        old.raw(entry)
    new = Driver(ClusterMachine(tmp_path / "new"))
    typed_units = [Unit.model_validate(u) for u in units]
    new.now = 1.0
    for cmd, now in [
        (ScopeAlloc(name="disk_id", count=7), 1.0),
        *((DiskAddCmd(disk=DiskAdd(disk_id=i + 1, host=f"http://h{i}", idc="z0", rack="r0", path="/d", size=100,
                                   free=90)), 2.0) for i in range(7)),
        (DiskHeartbeatCmd(disks=[DiskBeat(disk_id=1, size=100, free=80, chunks=1)]), 3.0),
        (ScopeAlloc(name="vid", count=1), 4.0),
        (KvSet(key="volume_intent/1", value=json.dumps({"vid": 1, "units": units})), 4.5),
        (VolumeCreate(vid=1, code_mode=CodeMode.EC3P3, backend="isal", units=typed_units, capacity=1 << 30),
         5.0),
        (KvDelete(key="volume_intent/1"), 5.5),
        (VolumeAllocCmd(code_mode=CodeMode.EC3P3, holder="a", count=1, lease_ttl=30.0), 6.0),
        (VolumeRetainCmd(holder="a", lease_ttl=30.0, volumes=[RetainItem(vid=1, used=4096)]), 7.0),
        (DiskSetCmd(disk_id=2, status=DiskStatus.BROKEN), 8.0),
        (ServiceRegisterCmd(name="worker", host="http://w", ttl=10.0), 9.0),
        (ServiceHeartbeat(name="worker", host="http://w"), 9.5),
        (ConfigSet(key="code_mode_policy", value='[{"code_mode": "EC3P3"}]'), 10.0),
        (KvCas(key="lease", expected=None, value="s1"), 11.0),
        (VolumeLock(vid=1), 12.0),
        (UnitAllocCmd(vid=1, index=1, disk_id=7), 13.0),
        (DiskSetCmd(disk_id=1, readonly=True), 13.5),
    ]:
        new.now = now
        new(cmd)
    try:
        assert old.state.applied_index() == new.state.applied_index() == len(old_log)
        assert old.state.checksum() == new.state.checksum()
        assert old.state.volume(1).pending_units[1].disk_id == 7
        assert encode(KvCas(key="lease", expected=None, value="s1"), 11.0) == old_log[-4]  # byte for byte
        created = VolumeCreate(vid=1, code_mode=CodeMode.EC3P3, backend="isal", units=typed_units, capacity=1 << 30)
        assert encode(created, 5.0) == old_log[11]  # the code mode logged as its number, as always
        for replica in (old, new):  # entries in sessions follow in the same log, a retry among them
            replica.now = 20.0
            replica(ScopeAlloc(name="bid", count=3), session("svc", 1))
            replica.raw(_old_entry("kv_set", 21.0, key="plain", value="1"))
            replica(ScopeAlloc(name="bid", count=3), session("svc", 1))
        assert old.state.checksum() == new.state.checksum() and old.state.scope("bid") == 3
    finally:
        old.state.close()
        new.state.close()


def test_a_volume_record_keeps_its_code_mode_as_the_number_it_was_stored_with() -> None:
    """Records in RocksDB and answers on the wire carry the mode's number; one read back is written byte for byte
    as before (replicas compare state checksums), and the number also reads as the mode's name."""
    stored = ('{"vid":1,"code_mode":11,"backend":"isal","status":"idle","units":[],"capacity":1,"used":0,'
              '"lease_holder":"","lease_expiry":0.0,"pending_units":{},"dropped_epochs":{},"under_spread":false}')
    volume = VolumeInfo.model_validate_json(stored)
    assert volume.code_mode is CodeMode.EC3P3
    assert volume.model_dump_json() == stored
    assert VolumeInfo.model_validate_json(stored.replace('"code_mode":11', '"code_mode":"EC3P3"')) == volume
