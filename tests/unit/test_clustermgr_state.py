"""The clustermgr state machine driven by commands alone, as Raft would apply them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.ec import CodeMode
from libs.proto.ids import Vuid
from libs.rpc import errors
from services.clustermgr.state import ClusterState, decode_result, encode_command


class Driver:
    """Applies commands with consecutive indexes and decodes the answers."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.index = state.applied_index()
        self.now = 1000.0

    def __call__(self, op: str, **args: Any) -> Any:
        self.index += 1
        return decode_result(self.state.apply(self.index, encode_command(op, self.now, **args)))


@pytest.fixture
def cm(tmp_path: Path) -> Iterator[Driver]:
    state = ClusterState(tmp_path / "state")
    yield Driver(state)
    state.close()


def add_disks(cm: Driver, azs: int = 1, hosts: int = 6) -> None:
    cm("scope_alloc", name="disk_id", count=azs * hosts)
    disk_id = 0
    for a in range(azs):
        for h in range(hosts):
            disk_id += 1
            cm("disk_add", disk={"disk_id": disk_id, "host": f"http://h{a}-{h}", "idc": f"z{a}", "rack": f"r{h % 2}",
                                 "path": "/d", "size": 100, "free": 100})


def ec3p3_units(vid: int, first_disk: int = 1) -> list[dict[str, Any]]:
    return [{"vuid": Vuid.make(vid, i, 1), "disk_id": first_disk + i, "host": f"http://h0-{i}"} for i in range(6)]


def create_volume(cm: Driver, vid: int) -> dict[str, Any]:
    return cm("volume_create", vid=vid, code_mode=int(CodeMode.EC3P3), backend="isal", units=ec3p3_units(vid),
              capacity=1 << 30)


def test_scopes_are_monotonic_and_survive_restart(tmp_path: Path) -> None:
    state = ClusterState(tmp_path / "s")
    cm = Driver(state)
    assert cm("scope_alloc", name="bid", count=10) == {"name": "bid", "start": 1, "end": 10}
    assert cm("scope_alloc", name="bid", count=5)["start"] == 11
    with pytest.raises(errors.BadRequest):
        cm("scope_alloc", name="bid", count=0)
    state.close()
    state = ClusterState(tmp_path / "s")
    assert state.applied_index() == 3
    assert Driver(state)("scope_alloc", name="bid", count=1)["start"] == 16
    state.close()


def test_disk_ids_must_be_allocated_and_never_reused(cm: Driver) -> None:
    disk = {"disk_id": 1, "host": "http://h", "idc": "z0", "rack": "r0", "path": "/d"}
    with pytest.raises(errors.BadRequest, match="never allocated"):
        cm("disk_add", disk=disk)
    cm("scope_alloc", name="disk_id", count=1)
    cm("disk_add", disk=disk)
    before = cm.state.checksum()
    with pytest.raises(errors.Conflict, match="already registered"):
        cm("disk_add", disk={**disk, "host": "http://other"})
    assert cm.state.checksum() == before
    assert cm.state.disk(1).host == "http://h"


def test_disk_status_follows_the_transition_table(cm: Driver) -> None:
    add_disks(cm)
    cm("disk_set", disk_id=1, status="broken")
    with pytest.raises(errors.Conflict, match="from broken to normal"):
        cm("disk_set", disk_id=1, status="normal")
    cm("disk_set", disk_id=1, status="repairing")
    cm("disk_set", disk_id=1, status="repaired")
    cm("disk_set", disk_id=2, readonly=True)
    assert cm.state.disk(2).readonly and not cm.state.disk(2).writable
    cm.now = 2000.0
    cm("disk_heartbeat", disks=[{"disk_id": 3, "size": 100, "free": 42}])
    assert (cm.state.disk(3).free, cm.state.disk(3).last_heartbeat) == (42, 2000.0)


def test_volume_create_refuses_bad_placements(cm: Driver) -> None:
    add_disks(cm)
    cm("scope_alloc", name="vid", count=3)
    units = ec3p3_units(1)
    units[1] = {**units[1], "disk_id": 1}
    with pytest.raises(errors.Conflict, match="two units on one disk"):
        cm("volume_create", vid=1, code_mode=int(CodeMode.EC3P3), backend="isal", units=units, capacity=1)
    with pytest.raises(errors.BadRequest, match="never allocated"):
        create_volume(cm, 9)
    with pytest.raises(errors.BadRequest, match="unknown code mode number 99"):
        cm("volume_create", vid=1, code_mode=99, backend="isal", units=ec3p3_units(1), capacity=1)
    with pytest.raises(errors.NotFound):
        cm.state.volume(1)
    created = create_volume(cm, 1)
    assert created["status"] == "idle" and len(created["units"]) == 6
    with pytest.raises(errors.Conflict, match="already exists"):
        create_volume(cm, 1)


def test_six_p6_needs_three_azs(cm: Driver) -> None:
    add_disks(cm, azs=1, hosts=12)
    cm("scope_alloc", name="vid", count=1)
    units = [{"vuid": Vuid.make(1, i, 1), "disk_id": i + 1, "host": "h"} for i in range(12)]
    with pytest.raises(errors.Conflict, match="3 distinct AZs"):
        cm("volume_create", vid=1, code_mode=int(CodeMode.EC6P6), backend="isal", units=units, capacity=1)


def test_leases_are_exclusive_renewable_and_lapse(cm: Driver) -> None:
    add_disks(cm)
    cm("scope_alloc", name="vid", count=2)
    create_volume(cm, 1)
    create_volume(cm, 2)
    mode = int(CodeMode.EC3P3)
    first = cm("volume_alloc", code_mode=mode, holder="a1", count=1, lease_ttl=10)["volumes"]
    assert [v["vid"] for v in first] == [1]
    second = cm("volume_alloc", code_mode=mode, holder="a2", count=5, lease_ttl=10)["volumes"]
    assert [v["vid"] for v in second] == [2]  # never the volume a1 holds
    assert cm("volume_alloc", code_mode=mode, holder="a3", count=5, lease_ttl=10)["volumes"] == []
    answer = cm("volume_retain", holder="a1", lease_ttl=10, volumes=[{"vid": 1, "used": 50}, {"vid": 2}])
    assert [r["vid"] for r in answer["retained"]] == [1]
    assert answer["refused"][0]["vid"] == 2
    assert cm.state.volume(1).used == 50
    cm.now += 100  # every lease lapses
    lapsed = cm("volume_retain", holder="a1", lease_ttl=10, volumes=[{"vid": 1}])
    assert "lapsed" in lapsed["refused"][0]["reason"]
    assert [v["vid"] for v in cm("volume_alloc", code_mode=mode, holder="a3", count=1, lease_ttl=10)["volumes"]] == [1]
    cm("volume_release", vid=1, holder="a3")
    assert cm.state.volume(1).status == "idle"


def test_unit_moves_bump_the_epoch_and_refuse_stale_updates(cm: Driver) -> None:
    add_disks(cm, hosts=8)
    cm("scope_alloc", name="vid", count=1)
    create_volume(cm, 1)
    cm("volume_lock", vid=1)
    with pytest.raises(errors.Conflict, match="already holds a unit"):
        cm("volume_unit_alloc", vid=1, index=0, disk_id=2)
    unit = cm("volume_unit_alloc", vid=1, index=0, disk_id=7)
    assert Vuid(unit["vuid"]).epoch() == 2
    newer = cm("volume_unit_alloc", vid=1, index=0, disk_id=8)
    assert Vuid(newer["vuid"]).epoch() == 3
    with pytest.raises(errors.Conflict, match="not the reserved move"):
        cm("volume_unit_update", vid=1, index=0, vuid=unit["vuid"], disk_id=7)
    with pytest.raises(errors.Conflict, match="still moves"):
        cm("volume_unlock", vid=1)
    volume = cm("volume_unit_update", vid=1, index=0, vuid=newer["vuid"], disk_id=8)
    assert volume["units"][0]["disk_id"] == 8 and volume["pending_units"] == {}
    cm("volume_unlock", vid=1)
    assert cm.state.volume(1).status == "idle"


def test_kv_compare_and_set(cm: Driver) -> None:
    cm("kv_cas", key="leader", expected=None, value="s1")
    with pytest.raises(errors.Conflict):
        cm("kv_cas", key="leader", expected=None, value="s2")
    cm("kv_cas", key="leader", expected="s1", value="s2")
    cm("kv_set", key="task/1", value="x")
    assert cm.state.kv_list("task/") == {"task/1": "x"}
    cm("kv_cas", key="leader", expected="s2", value=None)
    assert cm.state.kv_get("leader") is None


def test_services_and_config(cm: Driver) -> None:
    cm("service_register", name="mqproxy", host="http://m1", idc="z0", ttl=5)
    cm.now += 10
    assert not next(cm.state.services("mqproxy")).alive(cm.now)
    cm("service_heartbeat", name="mqproxy", host="http://m1")
    assert next(cm.state.services("mqproxy")).alive(cm.now)
    with pytest.raises(errors.NotFound):
        cm("service_heartbeat", name="mqproxy", host="http://nope")
    cm("config_set", key="balance", value="false")
    assert cm.state.configs() == {"balance": "false"}


def test_refused_and_malformed_commands_change_nothing_but_the_index(cm: Driver) -> None:
    add_disks(cm)
    before = cm.state.checksum()
    with pytest.raises(errors.BadRequest, match="unknown command"):
        cm("drop_everything")
    with pytest.raises(errors.BadRequest, match="malformed"):
        cm("disk_set")
    assert cm.state.checksum() == before
    assert cm.state.applied_index() == cm.index


def test_snapshot_restore_gives_an_equal_checksum(tmp_path: Path, cm: Driver) -> None:
    add_disks(cm)
    cm("scope_alloc", name="vid", count=1)
    create_volume(cm, 1)
    cm.state.snapshot(tmp_path / "snap")
    other = ClusterState(tmp_path / "other")
    try:
        other.restore(tmp_path / "snap")
        assert other.checksum() == cm.state.checksum()
        assert other.applied_index() == cm.index
        assert other.volume(1) == cm.state.volume(1)
    finally:
        other.close()
