"""Volume health as clustermgr judges it, and what leasing, renewals, the volume floor and placement make of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from typing import Any

import pytest

from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.placement import replacement_disk
from blobstore_server.libs.proto.blobnode import ChunkInfo, ChunkStatus
from blobstore_server.libs.proto.cluster import DiskInfo, DiskStatus, Unit, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import CodeModeRule, DiskAdd, DiskBeat, RetainItem
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.client import HttpClient, Request
from blobstore_server.libs.rpc.errors import Unavailable
from blobstore_server.libs.rpc.testing import FakeReply, FakeTransport
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.commands.disks import DiskAddCmd, DiskHeartbeatCmd, DiskSetCmd
from blobstore_server.services.clustermgr.commands.keys import ScopeAlloc
from blobstore_server.services.clustermgr.commands.table import Command
from blobstore_server.services.clustermgr.commands.units import UnitAllocCmd, UnitUpdateCmd
from blobstore_server.services.clustermgr.commands.volumes import (
    VolumeAllocCmd,
    VolumeCreate,
    VolumeFull,
    VolumeLock,
    VolumeRelease,
    VolumeRetainCmd,
)
from blobstore_server.services.clustermgr.health import lease_rank, volume_health
from blobstore_server.services.clustermgr.volumes import VolumeCreator, volumes_short
from tests.support.clustermgr_state import Driver

EC3P3 = CodeMode.EC3P3
TIMEOUT = 30.0


def disk_info(disk_id: int, **changes: object) -> DiskInfo:
    return DiskInfo(disk_id=disk_id, host=f"http://h{disk_id}", idc="z0", rack="r0", path="/d",
                    last_heartbeat=1000.0).model_copy(update=changes)


def volume_on(vid: int, disk_ids: list[int], **changes: object) -> VolumeInfo:
    units = [Unit(vuid=Vuid.make(vid, i, 1), disk_id=d, host=f"http://h{d}") for i, d in enumerate(disk_ids)]
    return VolumeInfo(vid=vid, code_mode=EC3P3, backend="isal", units=units, capacity=100).model_copy(update=changes)


def test_health_names_every_reason() -> None:
    disks = {i: disk_info(i) for i in range(1, 7)}
    volume = volume_on(1, [1, 2, 3, 4, 5, 6])
    assert volume_health(volume, disks, 1010.0, TIMEOUT).model_dump() == {"writable": True, "why_not": "",
                                                                          "down_units": []}
    disks[3] = disk_info(3, last_heartbeat=960.0)
    disks[5] = disk_info(5, status=DiskStatus.BROKEN)
    disks[6] = disk_info(6, status=DiskStatus.DROPPING)  # still serving while its units move away
    health = volume_health(volume.model_copy(update={"status": VolumeStatus.LOCK, "used": 100}), disks, 1010.0,
                           TIMEOUT)
    assert not health.writable and health.down_units == [2, 4]
    assert health.why_not == ("locked while a unit moves; full; unit 2: disk 3 sent no heartbeat for 50 s;"
                              " unit 4: disk 5 is broken")
    del disks[1]
    assert "unit 0: its disk is not registered" in volume_health(volume, disks, 1010.0, TIMEOUT).why_not


def test_lease_rank_counts_down_and_avoided_units_up_to_the_put_slack() -> None:
    t = tactic(CodeMode.EC3P3)  # slack 1
    volume = volume_on(1, [1, 2, 3, 4, 5, 6])
    disks = {i: disk_info(i) for i in range(1, 7)}
    healthy = volume_health(volume, disks, 1000.0, TIMEOUT)
    assert lease_rank(t, volume, healthy, []) == 0
    assert lease_rank(t, volume, healthy, [4, 99]) == 1
    assert lease_rank(t, volume, healthy, [4, 5]) is None
    disks[2] = disk_info(2, status=DiskStatus.BROKEN)
    one_down = volume_health(volume, disks, 1000.0, TIMEOUT)
    assert lease_rank(t, volume, one_down, [2]) == 1  # the same unit counts once
    assert lease_rank(t, volume, one_down, [3]) is None


def add_hosts(driver: Driver, count: int) -> None:
    driver(ScopeAlloc(name="disk_id", count=count))
    for i in range(1, count + 1):
        driver(DiskAddCmd(disk=DiskAdd(disk_id=i, host=f"http://h{i}", idc="z0", rack="r0", path="/d", size=100,
                                       free=100)))


def add_a_second_disk_to_h1(driver: Driver) -> None:
    """Disk 8, behind another blobnode (URL) on the machine whose URL names h1."""
    driver(ScopeAlloc(name="disk_id", count=1))
    driver(DiskAddCmd(disk=DiskAdd(disk_id=8, host="http://h8", hostname="http://h1", idc="z0", rack="r0",
                                   path="/d", size=100, free=100)))


def create(driver: Driver, vid: int, disk_ids: list[int]) -> VolumeInfo:
    volume = volume_on(vid, disk_ids)
    return driver(VolumeCreate(vid=vid, code_mode=EC3P3, backend="isal", units=volume.units, capacity=1 << 20))


def short(driver: Driver, min_volumes: int, min_idle_volumes: int = 0) -> int:
    rule = CodeModeRule(code_mode="EC3P3", min_volumes=min_volumes, min_idle_volumes=min_idle_volumes)
    return volumes_short(driver.state, rule, driver.now, TIMEOUT)


def writable(driver: Driver) -> int:
    return 10 - short(driver, 10)


def test_leasing_takes_whole_volumes_first_and_never_one_past_the_slack(cm: Driver) -> None:
    add_hosts(cm, 8)
    cm(ScopeAlloc(name="vid", count=3))
    create(cm, 1, [1, 2, 3, 4, 5, 6])
    create(cm, 2, [3, 4, 5, 6, 7, 8])
    create(cm, 3, [1, 3, 4, 5, 6, 7])
    cm(DiskSetCmd(disk_id=1, status=DiskStatus.BROKEN))

    def lease(holder: str, count: int, avoid: list[int] | None = None) -> list[tuple[int, bool]]:
        got = cm(VolumeAllocCmd(code_mode=EC3P3, holder=holder, count=count, lease_ttl=10,
                                heartbeat_timeout=TIMEOUT, avoid_disks=avoid or []))
        return [(v.vid, v.writable) for v in got.volumes]

    assert lease("a", 1) == [(2, True)]  # the only volume with every unit up
    cm.now += TIMEOUT + 1  # every disk fell silent, and a's lease lapsed
    assert lease("b", 5) == []  # no volume reaches its quorum
    cm(DiskHeartbeatCmd(disks=[DiskBeat(disk_id=i, size=100, free=100) for i in range(1, 9) if i != 2]))
    # Disk 2 stays silent: volume 1 misses two units (never leased), volume 3 only disk 1's (leased last).
    assert lease("b", 5) == [(2, True), (3, False)]
    cm(VolumeRelease(vid=3, holder="b"))
    assert lease("c", 5, avoid=[7]) == []  # volume 3 would miss disk 1's unit and disk 7's


def test_old_log_leases_keep_their_vid_order(cm: Driver) -> None:
    add_hosts(cm, 7)
    add_a_second_disk_to_h1(cm)
    cm(ScopeAlloc(name="vid", count=2))
    assert create(cm, 1, [1, 2, 3, 4, 5, 8]).under_spread
    create(cm, 2, [2, 3, 4, 5, 6, 7])
    cm(DiskSetCmd(disk_id=1, status=DiskStatus.BROKEN))
    got = cm(VolumeAllocCmd(code_mode=EC3P3, holder="a", count=1, lease_ttl=10))  # as logged before health
    assert [v.vid for v in got.volumes] == [1]


def test_renewals_carry_health(cm: Driver) -> None:
    add_hosts(cm, 6)
    cm(ScopeAlloc(name="vid", count=1))
    create(cm, 1, [1, 2, 3, 4, 5, 6])
    cm(VolumeAllocCmd(code_mode=EC3P3, holder="a", count=1, lease_ttl=10, heartbeat_timeout=TIMEOUT))
    cm(DiskSetCmd(disk_id=4, status=DiskStatus.BROKEN))
    kept = cm(VolumeRetainCmd(holder="a", lease_ttl=10, volumes=[RetainItem(vid=1)], heartbeat_timeout=TIMEOUT))
    assert [(r.vid, r.writable, r.down_units) for r in kept.retained] == [(1, False, [3])]
    assert "unit 3: disk 4 is broken" in kept.retained[0].why_not
    assert writable(cm) == 0


def test_under_spread_is_recorded_at_creation_and_cleared_by_a_move(cm: Driver) -> None:
    add_hosts(cm, 7)
    add_a_second_disk_to_h1(cm)
    cm(ScopeAlloc(name="vid", count=2))
    assert create(cm, 1, [1, 2, 3, 4, 5, 8]).under_spread  # two units on h1's machine, as a 5-host cluster would
    assert not create(cm, 2, [1, 2, 3, 4, 5, 7]).under_spread
    got = cm(VolumeAllocCmd(code_mode=EC3P3, holder="a", count=1, lease_ttl=10, heartbeat_timeout=TIMEOUT))
    assert [v.vid for v in got.volumes] == [2]  # the well-spread one first
    cm(VolumeRelease(vid=2, holder="a"))
    cm(VolumeLock(vid=1))
    unit = cm(UnitAllocCmd(vid=1, index=5, disk_id=7))
    assert not cm(UnitUpdateCmd(vid=1, index=5, vuid=unit.vuid, disk_id=7)).under_spread


@pytest.mark.parametrize("status", [DiskStatus.BROKEN, DiskStatus.DROPPED])
def test_a_volume_on_an_out_of_service_disk_does_not_count_toward_the_floor(cm: Driver,
                                                                           status: DiskStatus) -> None:
    add_hosts(cm, 7)
    cm(ScopeAlloc(name="vid", count=2))
    create(cm, 1, [1, 2, 3, 4, 5, 6])
    create(cm, 2, [2, 3, 4, 5, 6, 7])
    assert writable(cm) == 2
    if status is DiskStatus.DROPPED:
        cm(DiskSetCmd(disk_id=7, status=DiskStatus.DROPPING))
        assert writable(cm) == 2
    cm(DiskSetCmd(disk_id=7, status=status) if status is DiskStatus.DROPPED
       else DiskSetCmd(disk_id=1, status=status))
    assert writable(cm) == 1


def test_a_volume_without_room_for_the_smallest_blob_or_found_full_does_not_count_toward_the_floor(
        cm: Driver) -> None:
    add_hosts(cm, 7)
    cm(ScopeAlloc(name="vid", count=2))
    create(cm, 1, [1, 2, 3, 4, 5, 6])
    create(cm, 2, [2, 3, 4, 5, 6, 7])
    cm(VolumeAllocCmd(code_mode=EC3P3, holder="a", count=2, lease_ttl=10, heartbeat_timeout=TIMEOUT))
    cm(VolumeRetainCmd(holder="a", lease_ttl=10, volumes=[RetainItem(vid=1, used=(1 << 20) - 4095)]))
    assert writable(cm) == 1  # 4095 bytes free: a blob's shard takes a page at least
    cm(VolumeFull(vid=2))
    assert writable(cm) == 0



def test_the_floor_counts_only_volumes_with_room_for_the_largest_blob_allocators_ask_for(cm: Driver) -> None:
    """A volume with room for a small blob but not for the allocators' largest is full for the floor (and for
    leasing): counted writable, the floor made no new volume while every one held took only small objects."""
    add_hosts(cm, 6)
    cm(ScopeAlloc(name="vid", count=1))
    create(cm, 1, [1, 2, 3, 4, 5, 6])
    cm(VolumeAllocCmd(code_mode=EC3P3, holder="a", count=1, lease_ttl=10, heartbeat_timeout=TIMEOUT))
    left = space.blob_bytes(EC3P3, 300 << 10) - 1
    cm(VolumeRetainCmd(holder="a", lease_ttl=10, volumes=[RetainItem(vid=1, used=(1 << 20) - left)]))
    rule = CodeModeRule(code_mode="EC3P3", min_volumes=1, min_idle_volumes=0)
    assert volumes_short(cm.state, rule, cm.now, TIMEOUT, largest_blob=1024) == 0
    assert volumes_short(cm.state, rule, cm.now, TIMEOUT, largest_blob=300 << 10) == 1
    cm(VolumeRelease(vid=1, holder="a"))

    def lease_for(blob: int) -> list[int]:
        got = cm(VolumeAllocCmd(code_mode=EC3P3, holder="b", count=1, lease_ttl=10, heartbeat_timeout=TIMEOUT,
                                min_free=space.blob_bytes(EC3P3, blob)))
        return [v.vid for v in got.volumes]

    assert lease_for(300 << 10) == [] and lease_for(1024) == [1]

def test_the_floor_keeps_unleased_volumes_for_an_allocator_whose_peer_leased_every_one(cm: Driver) -> None:
    add_hosts(cm, 7)
    cm(ScopeAlloc(name="vid", count=3))
    for vid in (1, 2, 3):
        create(cm, vid, [1, 2, 3, 4, 5, 6])
    assert (short(cm, 3, 1), short(cm, 2, 3), short(cm, 5, 1), short(cm, 4, 4)) == (0, 0, 2, 1)
    assert short(cm, 0, 1) == 0  # no volumes wanted: no spare either
    cm(VolumeAllocCmd(code_mode=EC3P3, holder="a", count=2, lease_ttl=10, heartbeat_timeout=TIMEOUT))
    assert (short(cm, 3, 1), short(cm, 3, 2), short(cm, 2, 0), short(cm, 1, 2)) == (0, 1, 0, 0)
    cm(VolumeAllocCmd(code_mode=EC3P3, holder="a", count=1, lease_ttl=10, heartbeat_timeout=TIMEOUT))
    assert short(cm, 3, 1) == 1  # all three leased: one more, though three are writable
    cm.now += 11
    assert short(cm, 3, 3) == 0  # lapsed leases: leasable again
    leased = cm(VolumeAllocCmd(code_mode=EC3P3, holder="b", count=5, lease_ttl=10, heartbeat_timeout=TIMEOUT))
    assert [v.vid for v in leased.volumes] == [1, 2, 3]  # the rule the floor counts by is the one leasing follows
    cm.now += 11
    cm(DiskSetCmd(disk_id=6, status=DiskStatus.BROKEN))
    assert short(cm, 3, 1) == 3  # an unwritable volume is neither writable nor leasable


def creator_over_fake_blobnodes(cm: Driver, refusing: str = "", answering: asyncio.Event | None = None,
                                hung: str = "", chunk_timeout: float = 5.0) -> tuple[VolumeCreator, FakeTransport]:
    """Volume creation by the leader over a fake blobnode transport (named so); the host `refusing` plays a node
    killed moments ago, which clustermgr still counts as alive; the host `hung` one that accepts requests and never
    answers (a SIGSTOPped process: the request times out); with `answering`, chunk creations are answered once it
    is set."""

    async def blobnode(request: Request) -> FakeReply:
        if answering is not None and request.url.endswith("/chunk/create"):
            await answering.wait()
        if refusing and request.url.startswith(f"http://{refusing}/"):
            raise Unavailable("connection refused")
        if hung and request.url.startswith(f"http://{hung}/"):
            assert request.timeout is not None  # else a real transport waits its 30 s default
            await asyncio.sleep(request.timeout)
            raise Unavailable("timed out")
        vuid = json.loads(request.body or b"{}")["vuid"]
        return FakeReply.of(ChunkInfo(chunk_id="c", vuid=vuid, status=ChunkStatus.NORMAL, chunk_size=1 << 20,
                                      created=0.0))

    async def propose(cmd: Command[Any]) -> Any:
        return cm(cmd)

    transport = FakeTransport(blobnode)
    return VolumeCreator(cm.state, propose, BlobnodeClient(HttpClient(transport)), idcs=["z0"], backend="isal",
                         chunk_size=1 << 20, heartbeat_timeout=TIMEOUT, reserve=0,
                         chunk_timeout=chunk_timeout), transport


def test_a_volume_made_for_avoided_disks_has_none_of_them(cm: Driver) -> None:
    add_hosts(cm, 8)
    creator, _ = creator_over_fake_blobnodes(cm)
    vids = [asyncio.run(creator.create(CodeMode.EC3P3, cm.now, avoid_disks=[2, 5])) for _ in range(3)]
    assert all({u.disk_id for u in cm.state.volume(vid).units} == {1, 3, 4, 6, 7, 8} for vid in vids)


def test_a_roll_back_of_leftovers_leaves_a_creation_in_flight_alone(cm: Driver) -> None:
    add_hosts(cm, 6)

    async def scenario() -> None:
        answering = asyncio.Event()
        creator, transport = creator_over_fake_blobnodes(cm, answering=answering)
        creating = asyncio.create_task(creator.create(CodeMode.EC3P3, cm.now))
        while not cm.state.kv_list("volume_intent/"):  # its intent committed, its chunks being created
            await asyncio.sleep(0)
        await creator.roll_back_leftovers()
        answering.set()
        vid = await creating
        assert cm.state.has_volume(vid) and not cm.state.kv_list("volume_intent/")
        assert not any(r.url.endswith("/chunk/release") for r in transport.requests)

    asyncio.run(scenario())


def test_a_disk_whose_chunk_creation_failed_is_left_out_until_it_heartbeats_again(cm: Driver) -> None:
    add_hosts(cm, 7)
    creator, transport = creator_over_fake_blobnodes(cm, refusing="h3")

    async def create(times: int) -> None:
        for _ in range(times):
            with contextlib.suppress(Unavailable):
                await creator.create(CodeMode.EC3P3, cm.now)

    def tries_on_h3() -> int:
        return sum(r.url == "http://h3/chunk/create" for r in transport.requests)

    asyncio.run(create(4))
    assert tries_on_h3() == 1  # the fewest chunks would pick it every time; its failure rules it out
    assert writable(cm) == 3
    cm.now += 1
    cm(DiskHeartbeatCmd(disks=[DiskBeat(disk_id=3, size=100, free=100)]))  # it is back
    asyncio.run(create(1))
    assert tries_on_h3() == 2


def test_a_hung_node_fails_a_creation_and_its_roll_back_within_the_chunk_timeout_and_is_left_out(cm: Driver) -> None:
    add_hosts(cm, 7)
    creator, transport = creator_over_fake_blobnodes(cm, hung="h3", chunk_timeout=0.2)
    for _ in range(2):  # a first volume may leave h3 out: then h3 holds the fewest chunks and the next takes it
        started = time.monotonic()
        try:
            asyncio.run(creator.create(CodeMode.EC3P3, cm.now))
        except Unavailable:
            break
    else:
        pytest.fail("no creation tried the hung node")
    assert time.monotonic() - started < 2.0
    vid = asyncio.run(creator.create(CodeMode.EC3P3, cm.now))
    assert 3 not in {u.disk_id for u in cm.state.volume(vid).units}
    assert sum(r.url == "http://h3/chunk/create" for r in transport.requests) == 1
    assert cm.state.kv_list("volume_intent/")  # the hung node's chunk stays to release: a later round retries it


def test_the_moves_of_a_lost_disk_reserved_before_any_heartbeat_spread_over_the_spare_disks(cm: Driver) -> None:
    """The scheduler reserves a destination per unit of a lost disk within a round, before the disks' next
    heartbeats report their chunks: each reservation counts at once, or every move goes to the disk that was the
    emptiest at the last heartbeat."""
    add_hosts(cm, 10)
    cm(ScopeAlloc(name="vid", count=8))
    for vid in range(1, 9):
        create(cm, vid, [1, 2, 3, 4, 5, 6])
    cm(DiskHeartbeatCmd(disks=[DiskBeat(disk_id=d, size=100, free=100, chunks=0 if d == 7 else 1)
                               for d in (7, 8, 9, 10)]))
    cm(DiskSetCmd(disk_id=1, status=DiskStatus.BROKEN))
    rng = random.Random(5)
    destinations = []
    for vid in range(1, 9):
        units = [cm.state.disk(u.disk_id) for u in cm.state.volume(vid).units]
        disk_id = replacement_disk(tactic(CodeMode.EC3P3), units, 0, cm.state.disks(), cm.now, TIMEOUT, rng=rng)
        destinations.append(cm(UnitAllocCmd(vid=vid, index=0, disk_id=disk_id)).disk_id)
    assert max(destinations.count(d) for d in (7, 8, 9, 10)) <= 3  # before: all eight on disk 7
    assert sorted(cm.state.disk(d).chunks for d in (7, 8, 9, 10)) == [2, 3, 3, 3]
