"""Writes keep flowing when blobnodes die, with real processes: kill -9 under a PUT
stream, nodes coming back, disks marked broken, and the spread of every volume."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from typer.testing import CliRunner

from blobstore_server.cli.cli import app
from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import VolumeView
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.access.config import AccessConfig
from blobstore_server.services.allocator.client import AllocatorClient
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.load import failures, put_stream, read_back, success_rate, wait_for_put
from tests.support.metrics import sample
from tests.support.processes import BlobnodeFactory, LocalCluster, Service, wait_until

ClusterFactory = Callable[..., LocalCluster]


def volumes_of(cluster: LocalCluster) -> list[VolumeView]:
    async def fetch() -> list[VolumeView]:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm:
            return await cm.list_volumes()

    return asyncio.run(fetch())


def test_one_of_six_blobnodes_killed_puts_keep_succeeding_and_it_is_used_again(cluster_factory: ClusterFactory
                                                                             ) -> None:
    cluster = cluster_factory(blobnodes=6, disks=2, min_volumes=8, disk_punish=3.0,
                              clustermgr={"disk_heartbeat_timeout": 3})
    access = cluster.access[0].url
    with httpx.Client(base_url=access, timeout=60) as client:
        wait_for_put(client, b"warm-up")
    volumes = volumes_of(cluster)
    assert len(volumes) >= 8
    for volume in volumes:  # created once all 12 disks registered: one unit per host, never two
        assert len({u.host for u in volume.units}) == 6 and not volume.under_spread, volume
    victim = random.Random(1).choice(cluster.blobnodes)
    with put_stream(access) as stream:
        stream.wait_for(40)
        victim.kill9()
        killed = time.monotonic()
        stream.wait_for(200, killed)
    after = stream.since(killed)
    assert success_rate(after) >= 0.995, failures(after)
    assert read_back(access, stream.acked) == []  # with the node still down: degraded reads

    def replaced() -> bool:  # its volumes are unwritable now; new ones double up on the five hosts left
        now = volumes_of(cluster)
        return all(not v.writable for v in now if v.vid in {old.vid for old in volumes}) and \
            sum(v.writable and v.under_spread for v in now) >= 8
    wait_until(replaced, 30, "volumes on the five live hosts", interval=0.2)

    victim.start()
    with httpx.Client(base_url=access, timeout=60) as client:
        # back in use once access's punishment of its disks ends (3 s here) and clustermgr hears it again
        wait_until(lambda: _lands_on(cluster, victim, client), 30, "a shard on the restarted node", interval=0.1)


def _lands_on(cluster: LocalCluster, node: Service, client: httpx.Client) -> bool:
    """PUT one object; whether a shard of it was written on `node`."""
    resp = client.put("/blob", content=random.randbytes(5000))
    assert resp.status_code == 200, resp.text
    vid, bid = next(Location.from_token(resp.json()["location"], cluster.secret.encode()).blob_ids())

    async def on_node() -> bool:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
            for unit in (await cm.get_volume(vid)).units:
                if unit.host == node.url:
                    try:
                        await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)
                        return True
                    except RpcError:  # skipped: the node is still punished
                        return False
        return False

    return asyncio.run(on_node())


def test_two_of_eight_blobnodes_killed_mid_object_the_put_moves_on_and_puts_keep_succeeding(
        cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(blobnodes=8, min_volumes=12, clustermgr={"disk_heartbeat_timeout": 3})
    access = cluster.access[0]
    with httpx.Client(base_url=access.url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        data = random.Random(3).randbytes(10 << 20)  # blobs of 4, 4 and 2 MiB
        used_before = _volume_use(cluster)
        killed: list[Service] = []

        def body() -> Iterator[bytes]:
            """The first blob, then kill two hosts of its volume once it is written, then the rest."""
            yield data[: 4 << 20]
            vid = _wait_for_allocation(cluster, used_before)
            volume = next(v for v in volumes_of(cluster) if v.vid == vid)
            wait_until(lambda: _shards_in(volume.units[0]) == 1, 20, "the first blob written", interval=0.05)
            for node in [n for n in cluster.blobnodes if n.url in {u.host for u in volume.units[1:]}][:2]:
                node.kill9()
                killed.append(node)
            yield data[4 << 20:]

        resp = client.put("/blob", content=body(), headers={"content-length": str(len(data))})
        assert resp.status_code == 200, resp.text
        token = resp.json()["location"]
        first, second = Location.from_token(token, cluster.secret.encode()).blobs  # where each blob really went
        assert first.count == 1 and second.count == 2 and first.vid != second.vid
        assert client.get(f"/blob/{token}").content == data
    orphans = [json.loads(line) for line in Path(access.config["orphan_log"]).read_text().splitlines()]
    assert [(o["vid"], len(o["shards"])) for o in orphans] == [(first.vid, 4)]  # the failed try, for deletion
    assert "retrying on another volume" in access.log_path.read_text()

    with put_stream(access.url) as stream:  # and the cluster as a whole keeps taking writes
        started = time.monotonic()
        stream.wait_for(200, started)
    after = stream.since(started)
    assert success_rate(after) >= 0.99, failures(after)
    assert read_back(access.url, {token: data, **stream.acked}) == []


def _volume_use(cluster: LocalCluster) -> dict[int, int]:
    async def stat() -> dict[int, int]:
        async with AllocatorClient([cluster.allocators[0].url]) as allocator:
            return {v.vid: v.used for v in (await allocator.stat(cluster.allocators[0].url)).volumes}

    return asyncio.run(stat())


def _wait_for_allocation(cluster: LocalCluster, before: dict[int, int]) -> int:
    """The volume the allocator has handed the object's space in since `before`."""
    grown: list[int] = []

    def allocated() -> bool:
        charge = space.charge(CodeMode.EC3P3, 10 << 20, 4 << 20)  # what the object takes on a unit
        grown[:] = [vid for vid, used in _volume_use(cluster).items() if used - before.get(vid, 0) >= charge]
        return bool(grown)

    wait_until(allocated, 20, "the object's allocation", interval=0.05)
    return grown[0]


def _shards_in(unit: Unit) -> int:
    async def stat() -> int:
        async with BlobnodeClient() as bn:
            return (await bn.chunk_stat(unit.host, unit.disk_id, unit.vuid)).shard_count

    return asyncio.run(stat())


def _cli(cluster: LocalCluster, *args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--clustermgr", ",".join(cm.url for cm in cluster.clustermgr)])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_broken_disk_makes_its_volumes_unwritable_and_new_ones_avoid_it(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(blobnodes=7)
    access = cluster.access[0].url
    with httpx.Client(base_url=access, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        listed = json.loads(_cli(cluster, "volume", "list", "--json"))
        assert listed and all(v["writable"] and v["why_not"] == "" for v in listed)
        broken = listed[0]["units"][2]["disk_id"]
        _cli(cluster, "disk", "set", str(broken), "--status", "broken")
        listed = json.loads(_cli(cluster, "volume", "list", "--json"))
        on_broken = [v for v in listed if any(u["disk_id"] == broken for u in v["units"])]
        assert on_broken
        for volume in on_broken:
            index = next(i for i, u in enumerate(volume["units"]) if u["disk_id"] == broken)
            assert not volume["writable"] and volume["down_units"] == [index]
            assert f"unit {index}: disk {broken} is broken" in volume["why_not"]

        def writable_without_it() -> bool:  # clustermgr keeps its floor of 2 writable volumes
            return sum(v.writable for v in volumes_of(cluster)) >= 2

        wait_until(writable_without_it, 20, "new writable volumes", interval=0.2)
        assert "no: unit" in _cli(cluster, "volume", "list")

        def allocator_knows() -> bool:  # it hears of the broken disk with its next lease renewal
            async def stat() -> bool:
                async with AllocatorClient([cluster.allocators[0].url]) as allocator:
                    pool = (await allocator.stat(cluster.allocators[0].url)).volumes
                return any(v.writable for v in pool) and all(v.writable == (broken not in v.disks) for v in pool)

            return asyncio.run(stat())

        wait_until(allocator_knows, 20, "the allocator to hear of the broken disk", interval=0.2)
        # A small object may still take a bid from a reservation made before: one lasts reserve_ttl at most.
        time.sleep(AccessConfig.model_fields["reserve_ttl"].default)
        for _ in range(20):
            token = client.put("/blob", content=b"x" * 100).json()["location"]
            vid = next(Location.from_token(token, cluster.secret.encode()).blob_ids())[0]
            assert all(u.disk_id != broken for v in volumes_of(cluster) if v.vid == vid for u in v.units)


def test_a_hung_blobnode_costs_one_hedge_and_one_put_grace_not_one_per_request(cluster_factory: ClusterFactory
                                                                               ) -> None:
    """A node that stops answering (SIGSTOP, as a host cut off the network) delays the first read by the hedge
    and the first PUT by the put grace (not the 10 s shard timeout); the requests after go around it."""
    cluster = cluster_factory(hedge_after=2.0, put_grace=1.0)
    rng = random.Random(4)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        objects = {}
        for _ in range(12):
            data = rng.randbytes(100_000)  # every data shard of EC3P3 holds some of it
            objects[client.put("/blob", content=data).json()["location"]] = data
        units = {v.vid: v.units for v in volumes_of(cluster)}

        def data_hosts(token: str) -> set[str]:
            vid = next(Location.from_token(token, cluster.secret.encode()).blob_ids())[0]
            return {u.host for u in units[vid][:3]}

        hung = next(n for n in cluster.blobnodes if n.url in data_hosts(next(iter(objects))))
        on_hung = [token for token in objects if hung.url in data_hosts(token)]
        assert len(on_hung) >= 3
        os.kill(hung.pid, signal.SIGSTOP)  # alive but answering nothing
        try:
            timings = []
            for token in on_hung:
                started = time.monotonic()
                assert client.get(f"/blob/{token}").content == objects[token]
                timings.append(time.monotonic() - started)
            put_timings = []
            for _ in range(4):
                data = rng.randbytes(100_000)
                started = time.monotonic()
                objects[client.put("/blob", content=data).json()["location"]] = data
                put_timings.append(time.monotonic() - started)
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        assert all(client.get(f"/blob/{token}").content == data for token, data in objects.items())
    assert timings[0] >= 2.0  # the first read waits out the hedge delay once
    assert max(timings[1:]) < 1.5, timings  # the next ones go around the slow node at once
    assert 1.0 <= put_timings[0] < 3.0, put_timings  # the quorum, then the grace for the hung node's shard
    assert max(put_timings[1:]) < 0.8, put_timings  # its disk is skipped from then on


def test_two_hung_hosts_of_every_volume_get_a_volume_made_clear_of_them_at_once(
        cluster_factory: ClusterFactory, blobnode_factory: BlobnodeFactory) -> None:
    """Two blobnodes stop answering (SIGSTOP, as if cut off: clustermgr, with a 60 s heartbeat timeout, still
    counts their disks alive) and every volume has a unit on each, one more than EC3P3's put slack. Once a PUT has
    waited out the shard timeout (3 s here) access avoids their disks, its allocator asks clustermgr for a volume
    clear of them, and clustermgr creates one on the six other hosts then and there instead of a minute later."""
    cluster = cluster_factory(blobnodes=6, disks=1, clustermgr={"disk_heartbeat_timeout": 60}, shard_timeout=3.0)
    access = cluster.access[0].url
    with httpx.Client(base_url=access, timeout=60) as client:
        wait_for_put(client, b"warm-up")
    # the allocator's 4 and clustermgr's one unleased, all on the first six hosts
    wait_until(lambda: len(volumes_of(cluster)) >= 5, 20, "five volumes")
    before = volumes_of(cluster)
    for name in ("bn6", "bn7"):
        blobnode_factory(name, disks=1, clustermgr=cluster.clustermgr, delete_hold=2.0)
    hung = cluster.blobnodes[:2]
    hung_hosts = {node.url for node in hung}
    assert all(hung_hosts <= {u.host for u in v.units} for v in before)  # made before bn6 and bn7 joined
    try:
        for node in hung:
            os.kill(node.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        with put_stream(access, writers=2, max_size=16 << 10) as stream:
            stream.wait_for(50, stopped + 8.0, timeout=60)
        made = [v for v in volumes_of(cluster) if v.vid not in {b.vid for b in before}]
    finally:
        for node in hung:
            os.kill(node.pid, signal.SIGCONT)
    first_ok = min((a.ended for a in stream.attempts if a.ok and a.started >= stopped), default=float("inf"))
    late = stream.since(stopped + 8.0)
    print(f"first PUT after the hang acknowledged in {first_ok - stopped:.1f} s")
    assert first_ok - stopped < 8.0 and success_rate(late) >= 0.99, failures(late)
    assert made and all(not hung_hosts & {u.host for u in v.units} for v in made)
    avoiding = sum(sample(cm.url, "blobstore_clustermgr_volumes_created_total", {"why": "avoiding"})
                   for cm in cluster.clustermgr)
    assert 1 <= avoiding <= len(made)  # counted where operators look for it
    assert read_back(access, stream.acked) == []
