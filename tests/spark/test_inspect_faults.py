"""What the inspection reports when data is really damaged: a wiped disk, a blob that lost more than M
shards, a flipped byte (--deep), a shard with valid CRCs but wrong bytes (--deep), a blobnode that is down
and an export file that cannot be read. Two jobs on the test session's SparkSession."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from pyspark.sql import SparkSession

from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.spark.inputs import export_all
from tests.support.damage import flip_a_byte, lose_shard
from tests.support.load import wait_for_put
from tests.support.processes import LocalCluster, Service
from tests.support.shards import blobs_of
from tests.support.spark import blobstore, cluster_args, found, summary

ClusterFactory = Callable[..., LocalCluster]


def units_of(cluster: LocalCluster, vid: int) -> list[Unit]:
    async def get() -> list[Unit]:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm:
            return (await cm.get_volume(vid)).units

    return asyncio.run(get())


def node_of(cluster: LocalCluster, unit: Unit) -> Service:
    return next(node for node in cluster.blobnodes if node.url == unit.host)


def blobnode_call(call: Callable[[BlobnodeClient], Awaitable[object]]) -> None:
    async def run() -> None:
        async with BlobnodeClient() as bn:
            await call(bn)

    asyncio.run(run())


def test_damage_is_classified_and_missing_exports_are_unavailable(cluster_factory: ClusterFactory,
                                                                   spark: SparkSession, tmp_path: Path) -> None:
    cluster = cluster_factory()
    args = cluster_args(cluster)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        blobs = [blobs_of(cluster, wait_for_put(client, random.Random(i).randbytes(30_000)))[0] for i in range(4)]
    wiped = cluster.blobnodes[1]
    (lost_vid, lost_bid), (bad_vid, bad_bid), (odd_vid, odd_bid) = blobs[:3]
    others = [u for u in units_of(cluster, lost_vid) if u.host != wiped.url]
    for unit in others[:4]:  # 4 of 6 gone (1 left + the wiped one): fewer than N=3 remain
        blobnode_call(lambda bn, u=unit: lose_shard(bn, u, lost_bid))
    bad_index, bad_unit = next((i, u) for i, u in enumerate(units_of(cluster, bad_vid)) if u.host != wiped.url)
    flip_a_byte(bad_unit, bad_bid)
    odd_unit = next(u for u in units_of(cluster, odd_vid) if u.host != wiped.url)
    flip_a_byte(odd_unit, odd_bid, keep_crc=True)  # other bytes under a good CRC: only the stripe's parity tells
    wiped.stop()  # the disk is replaced in place: same disk id, nothing on it
    for disk in wiped.workdir.glob("disk*"):
        for folder in ("meta", "data"):
            shutil.rmtree(disk / folder)
            (disk / folder).mkdir()
    wiped.start()

    out = tmp_path / "deep"
    result = blobstore("inspect", "run", "--out", str(out), "--settle", "0", "--deep", *args)
    assert result.exit_code == 2, result.output  # something is unrecoverable
    report = summary(out)
    assert {(v, b) for v, b, _ in found(out, "unrecoverable")} == {(lost_vid, lost_bid)}
    assert found(out, "corrupt_shards") == {(bad_vid, bad_bid, bad_index)}
    assert {(v, b) for v, b, _ in found(out, "parity_mismatch")} == {(odd_vid, odd_bid)}
    wiped_shards = {(vid, bid, next(i for i, u in enumerate(units_of(cluster, vid)) if u.host == wiped.url))
                    for vid, bid in blobs[1:]}
    assert wiped_shards <= found(out, "missing_shards")  # the wipe alone leaves every blob repairable
    assert report["unrecoverable"] == 1 and report["disks_unavailable"] == []

    # A node that is down and a damaged export file: those disks are unavailable, their units unknown.
    down, damaged = cluster.blobnodes[2], cluster.blobnodes[3]
    down.stop()
    source = tmp_path / "input"

    async def export() -> None:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
            assert down.url in (await export_all(cm, bn, str(source), timeout=30)).failed_hosts

    asyncio.run(export())
    damaged_disk = next(json.loads(m.read_text()) for m in (source / "manifests").glob("*.json")
                        if json.loads(m.read_text())["host"] == damaged.url)
    (source / damaged_disk["shard_file"]).write_bytes(b"not parquet")
    out = tmp_path / "partial"
    result = blobstore("inspect", "run", "--input", str(source), "--out", str(out), "--settle", "0", *args)
    assert result.exit_code in (0, 2), result.output
    report = summary(out)
    reasons = {d["host"]: d["reason"] for d in report["disks_unavailable"]}
    assert reasons.keys() == {down.url, damaged.url}
    assert "no export" in reasons[down.url] and "unreadable" in reasons[damaged.url]
    assert report["volumes_unavailable"] > 0
    assert not {d for d in report["by_host"] if d in (down.url, damaged.url)}  # nothing claimed about them
    assert "unavailable" in result.output
