"""Real clustermgr replicas (Raft over TCP) with real blobnodes registering and heartbeating."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.clustermgr import DiskAdd, DiskBeat, DiskView, RetainItem
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import errors
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.scheduler.mirror import VolumeMirror
from tests.support.metrics import sample
from tests.support.processes import BlobnodeFactory, Service, free_port, signing_as
from tests.support.waiting import eventually

T = TypeVar("T")
ClusterMgrFactory = Callable[..., list[Service]]
FAST = {"volume_check_interval": 0.2, "disk_heartbeat_timeout": 5, "volume_lease_ttl": 5, "chunk_size": 64 << 20,
        "code_modes": [{"code_mode": "EC3P3", "min_volumes": 2}]}


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


async def volumes_ready(c: ClusterClient, count: int) -> list[Any]:
    return await eventually(lambda: _at_least(c.list_volumes(), count), 20, f"{count} volumes")


async def _at_least(coro: Awaitable[list[Any]], count: int) -> list[Any] | None:
    items = await coro
    return items if len(items) >= count else None


async def chunks_on_blobnodes(nodes: list[Service]) -> set[int]:
    async with BlobnodeClient() as bn:
        vuids = set()
        for node in nodes:
            for disk in (await bn.stat(node.url)).disks:
                vuids |= {c.vuid for c in await bn.list_chunks(node.url, disk.disk_id)}
        return vuids


def test_blobnodes_register_and_volumes_are_created_leased_and_moved(
        clustermgr_factory: ClusterMgrFactory, blobnode_factory: BlobnodeFactory) -> None:
    cms = clustermgr_factory(**FAST)
    nodes = [blobnode_factory(f"bn{i}", disks=1, clustermgr=cms) for i in range(7)]

    async def scenario(c: ClusterClient) -> None:
        disks = await eventually(lambda: _at_least(c.list_disks(), 7), 10, "7 disks registered")
        assert sorted(d.disk_id for d in disks) == list(range(1, 8))
        assert all(d.alive for d in disks)
        volumes = await volumes_ready(c, 2)
        for volume in volumes:
            assert len({u.disk_id for u in volume.units}) == 6
            assert volume.status == "idle" and volume.backend == "isal"
        assert await chunks_on_blobnodes(nodes) == {u.vuid for v in volumes for u in v.units}
        assert await c.kv_list("volume_intent/") == {}

        # Leases are exclusive: a second holder never gets a leased volume.
        mode = CodeMode.EC3P3
        first = (await c.alloc_volumes(mode, "alloc-a", 1)).volumes
        second = (await c.alloc_volumes(mode, "alloc-b", 5)).volumes
        assert {v.vid for v in first}.isdisjoint(v.vid for v in second)
        leased = first[0]
        retained = await c.retain_volumes("alloc-b", [RetainItem(vid=leased.vid)])
        assert retained.retained == [] and "not leased to 'alloc-b'" in retained.refused[0].reason

        # A unit moves to a disk the volume does not use, with epoch + 1; a stale update is refused.
        await c.lock_volume(leased.vid)
        unit = await c.alloc_unit(leased.vid, 0)
        assert Vuid(unit.vuid).epoch() == 2 and unit.disk_id not in {u.disk_id for u in leased.units}
        with pytest.raises(errors.Conflict, match="not the reserved move"):
            await c.update_unit(leased.vid, 0, Vuid.make(leased.vid, 0, 1), unit.disk_id)
        moved = await c.update_unit(leased.vid, 0, unit.vuid, unit.disk_id)
        assert moved.units[0].vuid == unit.vuid
        await c.unlock_volume(leased.vid)

        # A reader that keeps volumes (the scheduler) asks only for what changed since the revision it saw.
        mirror = VolumeMirror(c)
        listed = {v.vid for v in await c.list_volumes()}
        seen = dict(await mirror.refresh())
        # clustermgr may make a volume meanwhile: its floor of unleased ones went down with the leases above
        assert listed <= seen.keys() <= {v.vid for v in await c.list_volumes()}
        quiet = await c.volumes_changed_since(mirror.revision)
        assert quiet.revision >= mirror.revision and seen.keys().isdisjoint(v.vid for v in quiet.volumes)
        await c.lock_volume(leased.vid)
        changed = await c.volumes_changed_since(mirror.revision)
        assert leased.vid in {v.vid for v in changed.volumes} and changed.revision > mirror.revision
        assert seen.keys() & {v.vid for v in changed.volumes} == {leased.vid}  # the others did not change
        assert (await mirror.refresh())[leased.vid].status == "lock" and seen[leased.vid].status == "idle"
        await c.unlock_volume(leased.vid)
        mirror.revision = 10**9  # a copy that followed another history (a cluster built anew) starts over
        assert (await mirror.refresh()).keys() >= seen.keys() and mirror.revision < 10**9
        with pytest.raises(errors.BadRequest, match="filter on your side"):
            await c.http.request("GET", f"{c.hosts[0]}/volume/list", params={"since": 0, "status": "idle"})

        # Refusals change nothing.
        known = await c.get_disk(1)
        # another node's disk: refused by its owner's identity (with auth: any signer but the owner)
        with signing_as("http://elsewhere"), pytest.raises(errors.Forbidden, match="belongs to"):
            await c.add_disk(DiskAdd(disk_id=1, host="http://elsewhere", idc="z0", rack="r", path="/x"))
        assert (await c.get_disk(1)).host == known.host
        with signing_as("http://h"), pytest.raises(errors.BadRequest, match="never allocated"):
            await c.add_disk(DiskAdd(disk_id=999, host="http://h", idc="z0", rack="r", path="/x"))
        with pytest.raises(errors.BadRequest, match="unknown code mode"):  # the client's model refuses it too
            await c.http.request("POST", f"{c.hosts[0]}/volume/alloc", json={"code_mode": 77, "holder": "alloc-a"})
        with pytest.raises(errors.BadRequest):
            await c.http.request("POST", f"{c.hosts[0]}/disk/set", json={"disk_id": 1, "status": "exploded"})
        await c.set_disk(2, status=DiskStatus.BROKEN)
        with pytest.raises(errors.Conflict, match="from broken to normal"):
            await c.set_disk(2, status=DiskStatus.NORMAL)

        # Config, CAS kv, services, scopes.
        await c.set_config("switch/balance", "off")
        assert (await c.list_config())["switch/balance"] == "off"
        with pytest.raises(errors.BadRequest, match="unknown config key 'balance': the keys are code_mode_policy, "):
            await c.set_config("balance", "false")
        with pytest.raises(errors.BadRequest, match="must be 'on' or 'off'"):
            await c.set_config("switch/balance", "false")
        assert "EC3P3" in (await c.get_config("code_mode_policy") or "")
        await c.kv_cas("demo/owner", None, "s1")
        with pytest.raises(errors.Conflict):
            await c.kv_cas("demo/owner", None, "s2")
        await c.register_service("mqproxy", "http://m1", ttl=30)
        assert [s.host for s in await c.list_services("mqproxy")] == ["http://m1"]
        a, b = await c.alloc_scope("bid", 100), await c.alloc_scope("bid", 100)
        assert a.end < b.start

        # Every replica applied the same state.
        statuses = [await c.raft_status(cm.url) for cm in cms]
        applied = max(s.applied_index for s in statuses)
        await eventually(lambda: _same_checksum(c, cms, applied), 5, "equal checksums")

    run(_with_cluster(cms, scenario))


async def _same_checksum(c: ClusterClient, cms: list[Service], applied: int) -> bool:
    statuses = [await c.raft_status(cm.url) for cm in cms]
    at_least = [s for s in statuses if s.applied_index >= applied]
    if len(at_least) < len(cms):
        return False
    # Heartbeats keep applying; compare replicas that stand at the same index.
    by_index: dict[int, set[int]] = {}
    for s in statuses:
        by_index.setdefault(s.applied_index, set()).add(s.checksum)
    return all(len(v) == 1 for v in by_index.values()) and len(by_index) == 1


async def _with_cluster(cms: list[Service], scenario: Callable[[ClusterClient], Awaitable[None]]) -> None:
    async with ClusterClient([cm.url for cm in cms]) as c:
        await scenario(c)


def test_a_follower_points_to_the_leader(clustermgr_factory: ClusterMgrFactory) -> None:
    cms = clustermgr_factory(**FAST)

    async def scenario(c: ClusterClient) -> None:
        await c.kv_set("k", "v")
        leader = (await c.raft_status()).leader
        follower = next(cm for i, cm in enumerate(cms, start=1) if i != leader)

        async def follower_knows_the_leader() -> bool:
            return (await c.raft_status(follower.url)).leader == leader

        # A commit needs only a majority: the other follower may hear of the leader a heartbeat later.
        await eventually(follower_knows_the_leader, 5, "the follower learns who leads")
        with pytest.raises(errors.NotLeader) as refused:
            await c.http.request("POST", f"{follower.url}/kv/set", json={"key": "k", "value": "w"})
        assert refused.value.details["leader"] == cms[leader - 1].url
        async with ClusterClient([follower.url]) as via_follower:
            await via_follower.kv_set("k", "w")  # the client follows the hint
            assert await via_follower.kv_get("k") == "w"

    run(_with_cluster(cms, scenario))


def test_kill9_leader_during_heartbeats_and_volume_creation(
        clustermgr_factory: ClusterMgrFactory, blobnode_factory: BlobnodeFactory) -> None:
    cms = clustermgr_factory(**{**FAST, "code_modes": [{"code_mode": "EC3P3", "min_volumes": 6}]})
    nodes = [blobnode_factory(f"bn{i}", disks=1, clustermgr=cms) for i in range(6)]

    async def scenario(c: ClusterClient) -> None:
        await eventually(lambda: _at_least(c.list_disks(), 6), 10, "6 disks registered")
        acked: list[str] = []
        stop = asyncio.Event()

        async def writer() -> None:
            i = 0
            while not stop.is_set():
                try:
                    await c.kv_set(f"w/{i}", str(i))
                    acked.append(f"w/{i}")
                except errors.Unavailable:
                    pass
                i += 1

        task = asyncio.create_task(writer())
        await eventually(lambda: _at_least(c.list_volumes(), 2), 20, "volume creation under way")
        leader_id = (await c.raft_status()).leader
        cms[leader_id - 1].kill9()
        killed_at = time.monotonic()
        survivors = [cm for i, cm in enumerate(cms, start=1) if i != leader_id]
        async with ClusterClient([cm.url for cm in survivors], deadline=5) as s:
            await s.kv_set("after-failover", "1")
            assert time.monotonic() - killed_at < 2.0 + 0.5  # election plus one round trip
            await volumes_ready(s, 6)
            stop.set()
            await task
            assert await eventually(lambda: _no_intents(s), 10, "intents resolved")
            volumes = await s.list_volumes()
            assert await chunks_on_blobnodes(nodes) == {u.vuid for v in volumes for u in v.units}
            for cm in survivors:
                async with ClusterClient([cm.url]) as one:
                    status = await one.raft_status(cm.url)
                    assert status.applied_index > 0
            items = await s.kv_list("w/")
            assert set(acked) <= set(items)

    run(_with_cluster(cms, scenario))


async def _none(coro: Awaitable[set[int]]) -> bool:
    return not await coro


async def _no_intents(c: ClusterClient) -> bool:
    return await c.kv_list("volume_intent/") == {}


def _creations_failed(cms: list[Service], at_least: int) -> bool:
    return sum(sample(cm.url, "blobstore_clustermgr_volume_creations_failed_total", {"code_mode": "EC3P3"})
               for cm in cms) >= at_least


def test_a_volume_whose_chunks_cannot_all_be_created_is_rolled_back(
        clustermgr_factory: ClusterMgrFactory, blobnode_factory: BlobnodeFactory) -> None:
    cms = clustermgr_factory(**{**FAST, "code_modes": [{"code_mode": "EC3P3", "min_volumes": 0}]})
    nodes = [blobnode_factory(f"bn{i}", disks=1, clustermgr=cms) for i in range(6)]

    async def scenario(c: ClusterClient) -> None:
        await eventually(lambda: _at_least(c.list_disks(), 6), 10, "6 disks registered")
        nodes[0].kill9()  # its disk still looks alive until its heartbeat times out
        with pytest.raises(errors.BadRequest, match="invalid code_mode_policy"):
            await c.set_config("code_mode_policy", '[{"code_mode": "EC9P9"}]')
        await c.set_config("code_mode_policy", '[{"code_mode": "EC3P3", "min_volumes": 1}]')
        await eventually(lambda: asyncio.to_thread(_creations_failed, cms, at_least=3), 20,
                         "three creation rounds, each failing on the dead node")
        assert await c.list_volumes() == []
        # The live nodes release their chunks (a creation round may be midway at any one moment).
        await eventually(lambda: _none(chunks_on_blobnodes(nodes[1:])), 10, "chunks released on live nodes")
        assert await c.kv_list("volume_intent/") != {}  # kept until the dead node can confirm
        nodes[0].start()  # back: leftovers are rolled back there too, and a volume gets created
        volumes = await volumes_ready(c, 1)
        assert await eventually(lambda: _no_intents(c), 10, "intents resolved")
        assert await chunks_on_blobnodes(nodes) == {u.vuid for u in volumes[0].units}

    run(_with_cluster(cms, scenario))


def test_ec6p6_placement_over_three_azs_and_its_replacements(
        clustermgr_factory: ClusterMgrFactory, blobnode_factory: BlobnodeFactory) -> None:
    cms = clustermgr_factory(**{**FAST, "idcs": ["z0", "z1", "z2"],
                                "code_modes": [{"code_mode": "EC6P6", "min_volumes": 0}]})
    for az in range(3):
        for rack in range(2):
            for host in range(3):
                blobnode_factory(f"bn-{az}-{rack}-{host}", disks=1, clustermgr=cms, idc=f"z{az}", rack=f"z{az}-r{rack}")

    async def scenario(c: ClusterClient) -> None:
        await eventually(lambda: _at_least(c.list_disks(), 18), 20, "18 disks registered")
        disks = {d.disk_id: d for d in await c.list_disks()}
        await c.set_config("code_mode_policy", '[{"code_mode": "EC6P6", "min_volumes": 2}]')

        def check_spread(units: list[Any]) -> None:
            placed = [disks[u.disk_id] for u in units]
            for az in ("z0", "z1", "z2"):
                in_az = [d for d in placed if d.idc == az]
                assert len(in_az) == 4
                assert sorted(Counter(d.rack for d in in_az).values()) == [2, 2]
                assert len({d.host for d in in_az}) == 4
            assert all(placed[i].idc == placed[i - i % 2].idc for i in range(6))  # data pairs share an AZ

        volumes = await volumes_ready(c, 2)
        for volume in volumes:
            check_spread(volume.units)
        volume = volumes[0]
        broken = volume.units[5].disk_id
        await c.set_disk(broken, status=DiskStatus.BROKEN)
        await c.lock_volume(volume.vid)
        unit = await c.alloc_unit(volume.vid, 5)
        assert unit.disk_id != broken and disks[unit.disk_id].idc == disks[broken].idc
        moved = await c.update_unit(volume.vid, 5, unit.vuid, unit.disk_id)
        check_spread(moved.units)

    run(_with_cluster(cms, scenario))


def test_five_replicas_survive_two_leader_kills(clustermgr_factory: ClusterMgrFactory) -> None:
    cms = clustermgr_factory(count=5, **FAST)

    async def scenario(c: ClusterClient) -> None:
        await c.kv_set("before", "1")
        for round_ in range(2):
            leader = (await c.raft_status()).leader
            cms[leader - 1].kill9()
            started = time.monotonic()
            await c.kv_set(f"after-{round_}", "1")
            assert time.monotonic() - started < 2.5
        assert await c.kv_get("before") == "1"

    run(_with_cluster(cms, scenario))


def test_membership_change_under_writes_and_a_silent_disk(
        clustermgr_factory: ClusterMgrFactory, blobnode_factory: BlobnodeFactory, tmp_path: Path) -> None:
    cms = clustermgr_factory(**{**FAST, "disk_heartbeat_timeout": 2})
    node = blobnode_factory("bn", disks=1, clustermgr=cms)
    members = dict(cms[0].config["members"])
    new = {"raft_addr": f"127.0.0.1:{free_port()}", "http_addr": f"127.0.0.1:{free_port()}"}
    workdir = tmp_path / "cm4"
    workdir.mkdir()
    joiner = Service("clustermgr", {**cms[0].config, "node_id": 4, "members": {**members, "4": new},
                                             "join": True, "data_dir": str(workdir / "data")},
                     workdir, f"http://{new['http_addr']}")

    async def scenario(c: ClusterClient) -> None:
        await eventually(lambda: _at_least(c.list_disks(), 1), 10, "the disk registered")
        acked: list[str] = []
        stop = asyncio.Event()

        async def writer() -> None:
            i = 0
            while not stop.is_set():
                await c.kv_set(f"m/{i}", "x")
                acked.append(f"m/{i}")
                i += 1

        task = asyncio.create_task(writer())
        joiner.start()
        await c.add_member(4, new["raft_addr"], new["http_addr"], learner=True)
        await eventually(lambda: _caught_up(c, joiner.url), 10, "the learner caught up")
        status = await c.add_member(4, new["raft_addr"], new["http_addr"], learner=False)
        assert status.members["4"].voter is True
        leader = (await c.raft_status()).leader
        old = next(i for i in (1, 2, 3) if i != leader)
        status = await c.remove_member(old)
        assert str(old) not in status.members
        cms[old - 1].stop()
        await asyncio.sleep(0.5)
        stop.set()
        await task
        async with ClusterClient([joiner.url]) as via_new:
            assert set(acked) <= set(await via_new.kv_list("m/"))
            node.kill9()  # its disk stops heartbeating and is reported as not alive
            disks = await eventually(lambda: _all_dead(via_new), 10, "the silent disk reported")
            assert disks[0].disk_id == 1
            assert (await via_new.stat()).disks == 1

    try:
        run(_with_cluster(cms, scenario))
    finally:
        joiner.stop()


async def _caught_up(c: ClusterClient, url: str) -> bool:
    leader, learner = await c.raft_status(), await c.raft_status(url)
    return bool(learner.applied >= leader.commit - 5)


async def _all_dead(c: ClusterClient) -> list[DiskView] | None:
    disks = await c.list_disks()
    return disks if disks and not any(d.alive for d in disks) else None


def test_a_heartbeat_held_for_its_batch_is_answered_once_without_a_leader_search(
        clustermgr_factory: ClusterMgrFactory) -> None:
    """Clustermgr holds each disk heartbeat up to `disk_heartbeat_batch` (1 s, the client's attempt timeout) on
    purpose: the client waits for that, so one beat is one request, and no replica is asked who leads."""
    cms = clustermgr_factory(**FAST)

    async def requests(c: ClusterClient, route: str) -> float:
        total = 0.0
        for cm in cms:
            text = (await c.http.request("GET", f"{cm.url}/metrics")).decode()
            total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.startswith("blobstore_http_request_duration_seconds_count{")
                         and f'route="{route}"' in line)
        return total

    async def scenario(c: ClusterClient) -> None:
        disk_id = await c.alloc_disk_id()
        with signing_as("http://h"):
            await c.add_disk(DiskAdd(disk_id=disk_id, host="http://h", idc="z0", rack="r", path="/x"))
            before = {route: await requests(c, route) for route in ("/disk/heartbeat", "/raft/leader")}
            for _ in range(3):
                await c.disk_heartbeat([DiskBeat(disk_id=disk_id, size=100, free=50, chunks=0)])
            assert await requests(c, "/disk/heartbeat") == before["/disk/heartbeat"] + 3
            assert await requests(c, "/raft/leader") == before["/raft/leader"]
        assert (await c.get_disk(disk_id)).free == 50

    run(_with_cluster(cms, scenario))
