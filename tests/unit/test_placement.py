from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.placement import (
    Candidate,
    PlacementError,
    candidates,
    check_placement,
    place_volume,
    replace_unit,
    replacement_disk,
    shares_a_host,
)
from blobstore_server.libs.proto.cluster import DiskInfo, DiskStatus


def topology(azs: int, racks: int, hosts: int, disks: int, free: int = 100) -> list[Candidate]:
    out = []
    for a in range(azs):
        for r in range(racks):
            for h in range(hosts):
                for _d in range(disks):
                    out.append(Candidate(len(out) + 1, f"z{a}-r{r}-h{h}", f"z{a}", f"z{a}-r{r}", free))
    return out


def test_ec6p6_puts_four_units_per_az_and_spreads_racks_and_hosts() -> None:
    disks = topology(3, 2, 3, 2)
    t = tactic(CodeMode.EC6P6)
    for seed in range(50):
        placed = place_volume(t, disks, rng=random.Random(seed))
        check_placement(t, placed)
        assert Counter(c.idc for c in placed) == {"z0": 4, "z1": 4, "z2": 4}
        assert set(Counter(c.rack for c in placed).values()) == {2}
        assert len({c.host for c in placed}) == 12
        for index, disk in enumerate(placed):
            assert disk.idc == placed[next(i for i in range(12) if t.unit_az(i) == t.unit_az(index))].idc


def test_replacement_keeps_the_az_and_the_spread() -> None:
    disks = topology(3, 2, 3, 2)
    t = tactic(CodeMode.EC6P6)
    placed = place_volume(t, disks, rng=random.Random(1))
    for index in range(t.total):
        new = replace_unit(t, placed, index, disks, rng=random.Random(index))
        assert new.disk_id not in {c.disk_id for c in placed}
        after = [new if i == index else c for i, c in enumerate(placed)]
        check_placement(t, after)
        assert set(Counter(c.rack for c in after).values()) == {2}
        assert len({c.host for c in after}) == 12


def test_single_az_modes_and_shortages() -> None:
    t = tactic(CodeMode.EC3P3)
    placed = place_volume(t, topology(1, 1, 6, 2))
    assert len({c.host for c in placed}) == 6
    with pytest.raises(PlacementError, match="needs 6 disks"):
        place_volume(t, topology(1, 1, 5, 1))
    with pytest.raises(PlacementError, match="needs 3 AZs"):
        place_volume(tactic(CodeMode.EC6P6), topology(2, 2, 3, 2))
    full = place_volume(t, topology(1, 1, 6, 1))
    with pytest.raises(PlacementError, match="no disk"):
        replace_unit(t, full, 0, topology(1, 1, 6, 1))


def test_check_placement_refuses_bad_layouts() -> None:
    t = tactic(CodeMode.EC6P6)
    placed = place_volume(t, topology(3, 2, 3, 2))
    with pytest.raises(PlacementError, match="two units on one disk"):
        check_placement(t, [placed[0], *placed[:-1]])
    squashed = [c if c.idc != "z2" else Candidate(1000 + c.disk_id, c.host, "z1", c.rack, 1) for c in placed]
    with pytest.raises(PlacementError, match="3 distinct AZs"):
        check_placement(t, squashed)


def test_prefers_free_space_among_equal_spread() -> None:
    disks = [Candidate(i, f"h{i}", "z0", f"r{i}", free=i * 10) for i in range(1, 11)]
    placed = place_volume(tactic(CodeMode.EC3P3), disks, rng=random.Random(0))
    assert sorted(c.disk_id for c in placed) == [5, 6, 7, 8, 9, 10]


@settings(max_examples=300, deadline=None)
@given(mode=st.sampled_from(list(CodeMode)), racks=st.integers(1, 4), hosts=st.integers(1, 4),
       disks=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_any_topology_placement_holds_the_rules(mode: CodeMode, racks: int, hosts: int, disks: int, seed: int) -> None:
    t = tactic(mode)
    cluster = topology(t.az_count, racks, hosts, disks)
    per_az = t.total // t.az_count
    try:
        placed = place_volume(t, cluster, rng=random.Random(seed))
    except PlacementError:
        assert racks * hosts * disks < per_az
        return
    check_placement(t, placed)
    for az in range(t.az_count):
        in_az = [c for c in placed if c.idc == f"z{az}"]
        rack_counts = Counter(c.rack for c in in_az)
        host_counts = Counter(c.host for c in in_az)
        assert max(rack_counts.values()) - min(rack_counts.values()) <= 1
        assert max(host_counts.values()) <= -(-len(in_az) // (racks * hosts))


def test_a_unit_moves_only_to_a_disk_that_is_writable_and_heard_from() -> None:
    def disk(disk_id: int, **changes: object) -> DiskInfo:
        return DiskInfo(disk_id=disk_id, host=f"h{disk_id}", idc="z0", rack="r0", path="/d", free=100,
                        last_heartbeat=100.0).model_copy(update=changes)

    volume_disks = [disk(i) for i in range(1, 7)]
    others = [disk(7, last_heartbeat=10.0), disk(8, status=DiskStatus.BROKEN), disk(9, readonly=True), disk(10)]
    t = tactic(CodeMode.EC3P3)
    for seed in range(20):
        assert replacement_disk(t, volume_disks, 2, volume_disks + others, now=105.0, heartbeat_timeout=30.0,
                                rng=random.Random(seed)) == 10
    with pytest.raises(PlacementError):
        replacement_disk(t, volume_disks, 2, volume_disks + others[:3], now=105.0, heartbeat_timeout=30.0)
    with pytest.raises(PlacementError, match="no unit 6"):
        replacement_disk(t, volume_disks, 6, volume_disks + others, now=105.0, heartbeat_timeout=30.0)


@st.composite
def uneven_az(draw: st.DrawFn, idc: str, first_id: int) -> list[Candidate]:
    """One AZ of 1-9 hosts over 1-3 racks, each host with 1-4 disks of random free space."""
    out: list[Candidate] = []
    for h in range(draw(st.integers(1, 9))):
        rack = f"{idc}-r{draw(st.integers(0, 2))}"
        for _ in range(draw(st.integers(1, 4))):
            out.append(Candidate(first_id + len(out), f"{idc}-h{h}", idc, rack, draw(st.integers(0, 1000))))
    return out


def best_possible_share(pool: list[Candidate], units: int) -> int:
    """The smallest k such that at most k units per host can hold `units` units on these disks."""
    disks_per_host = Counter(c.host for c in pool)
    return next(k for k in range(1, units + 1) if sum(min(d, k) for d in disks_per_host.values()) >= units)


@settings(max_examples=200, deadline=None)
@given(mode=st.sampled_from(list(CodeMode)), data=st.data(), seed=st.integers(0, 10**6))
def test_no_host_holds_two_units_while_enough_hosts_exist(mode: CodeMode, data: st.DataObject, seed: int) -> None:
    """Over random uneven topologies: one unit per host whenever the AZ has the hosts; otherwise the
    fewest units per host the disks allow, and the volume is under-spread exactly then."""
    t = tactic(mode)
    pools = [data.draw(uneven_az(f"z{a}", 1000 * a + 1)) for a in range(t.az_count)]
    per_az = t.total // t.az_count
    try:
        placed = place_volume(t, [c for pool in pools for c in pool], rng=random.Random(seed))
    except PlacementError:
        assert any(len(pool) < per_az for pool in pools)
        return
    check_placement(t, placed)
    for pool in pools:
        in_az = [c for c in placed if c.idc == pool[0].idc]
        assert len(in_az) == per_az
        hosts = Counter(c.host for c in in_az)
        if len({c.host for c in pool}) >= per_az:
            assert max(hosts.values()) == 1
        else:
            assert max(hosts.values()) == best_possible_share(pool, per_az)
    under = [len({c.host for c in pool}) < per_az for pool in pools]
    assert shares_a_host(c.host for c in placed) == any(under)


@settings(max_examples=100, deadline=None)
@given(pool=uneven_az("z0", 1), seed=st.integers(0, 10**6), index=st.integers(0, 5))
def test_a_replacement_takes_a_host_the_volume_does_not_use_when_there_is_one(pool: list[Candidate], seed: int,
                                                                             index: int) -> None:
    t = tactic(CodeMode.EC3P3)
    try:
        placed = place_volume(t, pool, rng=random.Random(seed))
        new = replace_unit(t, placed, index, pool, rng=random.Random(seed))
    except PlacementError:
        assert len(pool) <= 6
        return
    others = {c.host for i, c in enumerate(placed) if i != index}
    if any(c.host not in others for c in pool if c not in placed):
        assert new.host not in others


def test_volume_creation_leaves_the_repair_reserve_and_skips_silent_disks() -> None:
    def disk(disk_id: int, chunks: int, heard: float = 100.0) -> DiskInfo:
        return DiskInfo(disk_id=disk_id, host=f"h{disk_id}", idc="z0", rack="r0", path="/d", max_chunks=10,
                        chunks=chunks, last_heartbeat=heard)

    disks = [disk(1, 7), disk(2, 8), disk(3, 9), disk(4, 0, heard=50.0)]
    assert [c.disk_id for c in candidates(disks, 100.0, 30.0, reserve=2)] == [1]
    assert [c.disk_id for c in candidates(disks, 100.0, 30.0)] == [1, 2, 3]  # repair may take the last slots


def test_a_burst_of_volumes_spreads_over_every_host_when_free_space_is_equal() -> None:
    """Disks on one filesystem report the same free space: chunk counts must spread the volumes."""
    disks = {d.disk_id: d for d in topology(1, 1, 8, 2)}
    units: Counter[str] = Counter()
    for seed in range(8):
        placed = place_volume(tactic(CodeMode.EC3P3), list(disks.values()), rng=random.Random(seed))
        for c in placed:
            units[c.host] += 1
            disks[c.disk_id] = Candidate(c.disk_id, c.host, c.idc, c.rack, c.free, c.chunks + 1)
    assert set(units.values()) == {6}  # 48 units over 8 hosts
    assert {c.chunks for c in disks.values()} == {3}


def test_the_machine_not_the_url_is_what_units_spread_over() -> None:
    """Nine machines in two racks, each with two blobnode processes (two URLs) of two disks: EC6P3 never puts two
    units on one machine, though 36 disks behind 18 URLs would let it, and its racks hold 5 and 4 units."""
    disks = [DiskInfo(disk_id=n * 4 + k + 1, host=f"http://10.0.0.{n}:{8889 + k // 2}", hostname=f"h{n}", idc="z0",
                      rack=f"r{n % 2}", path=f"/d{k}", free=100, last_heartbeat=1000.0)
             for n in range(9) for k in range(4)]
    pool = candidates(disks, 1000.0, 10.0)
    t = tactic(CodeMode.EC6P3)
    for seed in range(50):
        placed = place_volume(t, pool, rng=random.Random(seed))
        assert len({c.host for c in placed}) == 9
        assert sorted(Counter(c.rack for c in placed).values()) == [4, 5]
        assert all(c.url.startswith("http://10.0.0.") for c in placed)  # what a unit's chunk is created through
    lone = [d.model_copy(update={"hostname": ""}) for d in disks]  # unnamed: each URL stands for a host
    assert {c.host for c in candidates(lone, 1000.0, 10.0)} == {d.host for d in disks}


def test_the_units_of_a_broken_disk_spread_over_hosts_not_onto_its_sibling_disk() -> None:
    """Out of the pool, a broken disk must not make its host look emptier: by chunks in all, its sibling disk (half
    its host's disks left) took every unit of it, one disk's bandwidth then bounding the whole rebuild."""
    disks = {d.disk_id: d for d in topology(1, 1, 10, 2)}
    for disk_id, disk in disks.items():
        disks[disk_id] = Candidate(disk.disk_id, disk.host, disk.idc, disk.rack, disk.free, 5)
    volume = [disks[d] for d in (1, 3, 5, 7, 9, 11)]  # unit 0 on disk 1, which broke; hosts 1-5 hold the rest
    t = tactic(CodeMode.EC3P3)
    chosen = []
    for seed in range(4):
        pool = [c for c in disks.values() if c.disk_id != 1]
        new = replace_unit(t, volume, 0, pool, rng=random.Random(seed))
        chosen.append(new.host)
        disks[new.disk_id] = Candidate(new.disk_id, new.host, new.idc, new.rack, new.free, new.chunks + 1)
    assert len(set(chosen)) == 4, chosen
