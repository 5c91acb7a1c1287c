"""Volume space counted in the bytes chunks really spend, on real processes with small (1 MiB) chunks: small
objects retire their volumes by accounting before a chunk refuses a shard, and a volume whose chunk does refuse
one (full on one unit) leaves every allocator at once and is replaced."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.cluster import VolumeInfo
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc.errors import ChunkFull
from blobstore_server.services.allocator.client import AllocatorClient
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.load import wait_for_put
from tests.support.metrics import sample
from tests.support.processes import LocalCluster
from tests.support.waiting import eventually

ClusterFactory = Callable[..., LocalCluster]
CHUNK = 1 << 20
# Reservations of 8 bids and 16 KiB, for objects of up to 1 KiB: each is charged under 4% of a 1 MiB chunk
SMALL_RESERVATIONS = {"reserve_bids": 8, "reserve_bytes": 16 << 10}


def vid_of(token: str) -> int:
    return Location.from_token(token, LocalCluster.secret.encode()).blobs[0].vid


def first_put(access: str) -> str:
    with httpx.Client(base_url=access, timeout=60) as client:
        return wait_for_put(client, b"first")


def test_small_objects_retire_volumes_by_what_their_shards_take_before_a_chunk_fills(
        cluster_factory: ClusterFactory) -> None:
    """1 KiB objects take a 4 KiB page on every unit. Counted in logical bytes (`chunk_size x N`) a volume said
    it was 8% used when its chunks were full, and every PUT sent there missed its quorum. Counted in pages, the
    allocator moves to new volumes (clustermgr makes them) before any chunk refuses a shard: no PUT fails, no blob
    is written twice, and the volumes given up on are physically near full."""
    cluster = cluster_factory(clustermgr={"chunk_size": CHUNK}, **SMALL_RESERVATIONS)
    access = cluster.access[0].url
    acked: dict[str, bytes] = {}
    failed: list[str] = []
    count = itertools.count()

    def writer() -> None:
        with httpx.Client(base_url=access, timeout=60) as client:
            while (i := next(count)) < 1300:
                data = os.urandom(1024)
                resp = client.put("/blob", content=data)
                if resp.status_code == 200:
                    acked[resp.json()["location"]] = data
                else:
                    failed.append(f"PUT {i}: {resp.text[:300]}")

    first_put(access)
    threads = [threading.Thread(target=writer) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == []
    assert sample(access, "blobstore_access_put_quorum_misses_total") == 0

    async def check() -> None:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm:
            volumes = await cm.list_volumes()
            used = {vid_of(token) for token in acked}
            assert len(volumes) > 5 and len(used) > 4, "new volumes took the objects once the first were full"
            capacity = space.unit_capacity(CHUNK)
            full = await eventually(lambda: _reported_full(cm, capacity), 10, "a volume reported (nearly) full")
            async with BlobnodeClient() as blobnodes:
                for volume in full:
                    # A PUT is acknowledged at its quorum: one unit may lack a shard or two (repair's to write),
                    # so the volume is as full as its fullest unit
                    offsets = [(await blobnodes.chunk_stat(unit.host, unit.disk_id, unit.vuid)).write_offset
                               for unit in volume.units]
                    assert max(offsets) <= CHUNK and max(offsets) - 4096 >= 0.85 * capacity, (volume, offsets)

    asyncio.run(check())
    with httpx.Client(base_url=access, timeout=60) as client:
        for token, data in itertools.islice(acked.items(), 0, None, 10):
            assert client.get(f"/blob/{token}").content == data


async def _reported_full(cm: ClusterClient, capacity: int) -> list[VolumeInfo]:
    return [v for v in await cm.list_volumes() if v.used >= 0.9 * capacity]


async def fill_chunk(blobnodes: BlobnodeClient, volume: VolumeInfo, index: int) -> int:
    """Shards of no blob written straight into unit `index`'s chunk until it refuses even a 1-byte one; returns
    how many went in."""
    unit, bids = volume.units[index], itertools.count(1 << 40)
    written = 0
    for size in (200 << 10, 1):
        while True:
            try:
                await blobnodes.put_shard(unit.host, unit.disk_id, unit.vuid, next(bids), os.urandom(size))
            except ChunkFull:
                break
            written += 1
    return written


def test_a_volume_whose_chunk_is_full_on_one_unit_leaves_every_allocator_within_one_round(
        cluster_factory: ClusterFactory) -> None:
    """A unit's chunk full while the volume's accounting has room (filled behind its back here; in life a volume
    created before capacity counted what shards take, or a disk's chunks made smaller than clustermgr's): the blob
    written there still reaches its quorum, access tells its allocator, the allocator tells clustermgr, and within
    one renewal round (2 s) no allocator holds the volume any more; the floor makes a new one and PUTs go on."""
    retain_interval = 2.0  # the fixture's
    cluster = cluster_factory(clustermgr={"chunk_size": CHUNK, "code_modes": [
        {"code_mode": "EC3P3", "min_volumes": 2, "min_idle_volumes": 0}]}, allocators=2, **SMALL_RESERVATIONS)
    access = cluster.access[0].url

    async def scenario() -> None:
        async with (ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as blobnodes,
                    AllocatorClient([a.url for a in cluster.allocators]) as allocators,
                    httpx.AsyncClient(base_url=access, timeout=60) as client):
            full = await cm.get_volume(vid_of(await asyncio.to_thread(first_put, access)))
            assert await fill_chunk(blobnodes, full, 0) > 0
            for _ in range(200):  # until a PUT lands in the volume (the allocators pick by room)
                resp = await client.put("/blob", content=os.urandom(1024))
                assert resp.status_code == 200, resp.text
                if vid_of(resp.json()["location"]) == full.vid:
                    break
            else:
                pytest.fail(f"no PUT went to volume {full.vid}")
            landed = time.monotonic()
            resp = await client.put("/blob", content=b"the next PUT")  # user traffic goes on: it carries the news
            assert resp.status_code == 200 and vid_of(resp.json()["location"]) != full.vid

            async def held_anywhere() -> bool:
                stats = [await allocators.stat(a.url) for a in cluster.allocators]
                return not any(v.vid == full.vid for s in stats for v in s.volumes)

            await eventually(held_anywhere, retain_interval + 1.0, f"volume {full.vid} gone from every allocator")
            assert time.monotonic() - landed < retain_interval + 1.0
            retired = await cm.get_volume(full.vid)
            assert not retired.writable and "full" in retired.why_not and retired.lease_holder == ""
            await eventually(lambda: _writable_besides(cm, full.vid), 10, "a new volume in its place")
            for _ in range(50):
                resp = await client.put("/blob", content=os.urandom(1024))
                assert resp.status_code == 200 and vid_of(resp.json()["location"]) != full.vid

    asyncio.run(scenario())


async def _writable_besides(cm: ClusterClient, vid: int) -> bool:
    return sum(v.writable for v in await cm.list_volumes() if v.vid != vid) >= 2


def test_objects_of_one_size_never_jam_on_volumes_left_with_less_room_than_one_of_them(
        cluster_factory: ClusterFactory) -> None:
    """Objects all of 300 KiB: nine fit a 1 MiB chunk (each shard takes 100 KiB and its page), leaving ~90 KiB a
    unit. Counted as room (it fits the smallest blob), such a volume stayed writable for the floor, leasable, and
    held by the allocator, which stops at 16 volumes a mode: once all it held were such ones, every PUT answered
    503. A volume without room for the largest blob its allocator was asked for is full: retired, and replaced."""
    # a volume takes nine objects here, and clustermgr makes one at a time: a floor of 8 keeps ahead of the PUTs
    cluster = cluster_factory(clustermgr={"chunk_size": CHUNK, "code_modes": [
        {"code_mode": "EC3P3", "min_volumes": 8, "min_idle_volumes": 4}]}, **SMALL_RESERVATIONS)
    access = cluster.access[0].url
    size = 300 << 10
    room = space.unit_capacity(CHUNK) - 9 * space.blob_bytes(CodeMode.EC3P3, size)  # what nine leave a unit
    assert space.blob_bytes(CodeMode.EC3P3, 1) < room < space.blob_bytes(CodeMode.EC3P3, size)
    acked: dict[str, bytes] = {}
    waits = 0
    with httpx.Client(base_url=access, timeout=60) as client:
        first_put(access)
        for i in range(200):
            data = os.urandom(size)
            resp = client.put("/blob", content=data)
            # a jam answers 503 for good; a busy box can let the PUTs catch up with clustermgr's volume creation
            # for a moment, and a client waits the retry_after it is given
            for _ in range(3):
                if resp.status_code != 503:
                    break
                waits += 1
                time.sleep(resp.json()["retry_after"])
                resp = client.put("/blob", content=data)
            assert resp.status_code == 200, f"PUT {i}: {resp.text[:300]}"
            acked[resp.json()["location"]] = data
        assert waits <= 10, f"{waits} PUTs waited for a volume"
        assert len({vid_of(token) for token in acked}) > 16, "more volumes than an allocator may hold at once"
        for token, data in itertools.islice(acked.items(), 0, None, 7):
            assert client.get(f"/blob/{token}").content == data
