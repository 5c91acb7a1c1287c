"""Scrubbing on a real cluster (issue 26, item 3): a byte flipped behind a blobnode's back is found by the
blobnode's own scrub, its repair goes through mqproxy, tinker and the worker, and the shard reads back whole,
while no user reads the blob."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import httpx
from isal.isal_zlib import crc32
from prometheus_client.parser import text_string_to_metric_families

from blobstore_server.cluster.procs import wait_until
from blobstore_server.libs.proto.blobnode import DiskStat, NodeStat
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.damage import flip_a_byte
from tests.support.processes import LocalCluster

ClusterFactory = Callable[..., LocalCluster]
PERIOD = 3.0  # seconds per pass over each disk


def put(client: httpx.Client, data: bytes) -> str:
    """PUT once the cluster has volumes (the first ones come a moment after the disks register)."""
    tokens: list[str] = []

    def stored() -> bool:
        resp = client.put("/blob", content=data)
        tokens.extend([resp.json()["location"]] if resp.status_code == 200 else [])
        return bool(tokens)

    wait_until(stored, 20, "a PUT", interval=0.2)
    return tokens[0]


def unit_of(cluster: LocalCluster, vid: int, index: int) -> Unit:
    async def get() -> Unit:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm:
            return (await cm.get_volume(vid)).units[index]

    return asyncio.run(get())


def read_shard(unit: Unit, bid: int) -> bytes | RpcError:
    """The blobnode's shard read (it checks every block's CRC): the bytes, or why it refused."""

    async def read() -> bytes | RpcError:
        async with BlobnodeClient() as bn:
            try:
                return bytes(await bn.get_shard(unit.host, unit.disk_id, unit.vuid, bid))
            except RpcError as exc:
                return exc

    return asyncio.run(read())


def stats(cluster: LocalCluster) -> dict[int, DiskStat]:
    """Every disk of the cluster as its blobnode's /stat shows it, by disk id."""

    async def get() -> list[NodeStat]:
        async with BlobnodeClient() as bn:
            return [await bn.stat(node.url) for node in cluster.blobnodes]

    return {disk.disk_id: disk for node in asyncio.run(get()) for disk in node.disks}


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_scrub_finds_a_flipped_byte_and_has_the_shard_repaired_without_a_user_read(
        cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, blobnode={"scrub_period": PERIOD})
    rng = random.Random(26)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        tokens = [put(client, rng.randbytes(200_000)) for _ in range(3)]
    vid, bid = next(iter(Location.from_token(tokens[0], cluster.secret.encode()).blob_ids()))
    unit = unit_of(cluster, vid, 1)
    original = read_shard(unit, bid)
    assert isinstance(original, bytes)

    flip_a_byte(unit, bid)
    assert not isinstance(read_shard(unit, bid), bytes)  # the damage shows to a read of the shard

    def found() -> bool:
        scrub = stats(cluster)[unit.disk_id].scrub
        return scrub is not None and scrub.corrupt >= 1

    wait_until(found, 4 * PERIOD, "the scrub finding the flipped byte", interval=0.2)
    wait_until(lambda: read_shard(unit, bid) == original, 30, "the shard repaired", interval=0.2)
    repaired = read_shard(unit, bid)
    assert isinstance(repaired, bytes) and crc32(repaired) == crc32(original)

    scrub = stats(cluster)[unit.disk_id].scrub
    assert scrub is not None and scrub.repairs_queued >= 1 and scrub.repairs_owed == 0

    def every_disk_read_its_shards() -> bool:  # one shard of each of the 3 blobs on every disk (EC3P3 on 6 disks)
        return all(d.scrub is not None and d.scrub.shards >= 3 for d in stats(cluster).values())

    wait_until(every_disk_read_its_shards, 4 * PERIOD, "every disk scrubbed", interval=0.2)
    for disk in stats(cluster).values():
        assert disk.scrub is not None and disk.scrub.enabled and disk.scrub.last_full_pass is not None
        assert 0.0 <= disk.scrub.progress <= 1.0 and disk.scrub.bytes >= 200_000  # a third of each blob
        assert disk.disk_id == unit.disk_id or disk.scrub.corrupt == 0  # nothing else was damaged
    assert metric(unit.host, "blobstore_blobnode_scrub_corrupt_total", disk_id=str(unit.disk_id)) >= 1
    assert metric(unit.host, "blobstore_blobnode_scrub_repairs_queued_total", disk_id=str(unit.disk_id)) >= 1
    assert metric(unit.host, "blobstore_blobnode_scrub_last_pass_timestamp_seconds", disk_id=str(unit.disk_id)) > 0
    # nobody read the blob through access: the scrub alone found the damage
    assert metric(cluster.access[0].url, "blobstore_http_requests_total", route="/blob/{token}", method="GET") == 0
