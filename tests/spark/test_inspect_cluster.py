"""Inspection and backlog against a real cluster with Kafka: shards missed while a blobnode was frozen are
found exactly, counted as queued repairs while repair is switched off, and gone after `--repair` + on; a delete
left half done is finished by `--repair` (its delete message signed with the operator's intent key, which the
blobnodes take); the scheduler's task records (one stuck, one finished, one unreadable) are counted beside them.

Every job runs in this process through the CLI, on the test session's one SparkSession."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from pyspark.sql import SparkSession

from blobstore_server.libs.proto.scheduler import TaskRecord, TaskState
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.proto.tinker import TinkerStats
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.load import wait_for_put
from tests.support.processes import SIGNED, LocalCluster, wait_until
from tests.support.shards import blobs_of, states
from tests.support.spark import blobstore, cluster_args, found, summary
from tests.support.tickets import as_tinker

ClusterFactory = Callable[..., LocalCluster]


def repair_paused(cluster: LocalCluster) -> bool:
    answer = httpx.get(f"{cluster.background['tinker'].url}/stats", timeout=30, auth=SIGNED)
    stats = TinkerStats.model_validate_json(answer.content)
    return stats.pipelines["repair"].paused and stats.pipelines["repair_prior"].paused


def record_tasks(cluster: LocalCluster) -> None:
    """A disk repair stuck for 15 minutes, one finished a minute ago, and a record that is not JSON (this cluster
    runs no scheduler that would act on them)."""
    now = time.time()
    stuck = TaskRecord(task_id="repair-1", task_type=TaskType.DISK_REPAIR, state=TaskState.PREPARED, disk_id=1,
                       vid=1, unit_index=0, source_vuid=1 << 32 | 1, ctime=now - 900, mtime=now - 900)
    done = stuck.model_copy(update={"task_id": "repair-0", "state": TaskState.FINISHED, "mtime": now - 60})

    async def put() -> None:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm:
            for record in (stuck, done):
                await cm.kv_set(record.key, record.model_dump_json())
            await cm.kv_set("task/disk_repair/garbage", "{not json")

    asyncio.run(put())


def mark_deleted(cluster: LocalCluster, blob: tuple[int, int], units: range) -> None:
    """Mark the blob's shards on `units` deleted, as tinker does (its ticket, access's intent)."""
    async def mark() -> None:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
            volume = await cm.get_volume(blob[0])
            for u in (volume.units[i] for i in units):
                await bn.mark_delete_shard(u.host, u.disk_id, u.vuid, blob[1], **as_tinker(u.host, u.disk_id, u.vuid,
                                                                                            blob[1]))

    asyncio.run(mark())


def missing_by_blob(cluster: LocalCluster, blobs: list[tuple[int, int]]) -> set[tuple[int, int, int]]:
    """(vid, bid, unit index) of every shard its blobnode does not hold, asked one by one."""
    return {(vid, bid, index) for vid, bid in blobs for index, state in enumerate(states(cluster, vid, bid))
            if state == "missing"}


def test_frozen_node_shards_are_found_queued_and_repaired(cluster_factory: ClusterFactory, spark: SparkSession,
                                                          tmp_path: Path) -> None:
    cluster = cluster_factory(pipelines=True, tinker={"switch_interval": 0.3}, shard_timeout=1.0)
    args = cluster_args(cluster)
    tinker = cluster.background["tinker"].config
    kafka = ["--kafka", tinker["kafka_bootstrap"], "--cluster-id", str(tinker["cluster_id"]),
             "--group-prefix", tinker["group_prefix"]]
    assert blobstore("task", "switch", "shard_repair", "off", *args).exit_code == 0
    assert "shard_repair   │ off" in blobstore("task", "switches", *args).output
    wait_until(lambda: repair_paused(cluster), 10, "tinker to pause its repair pipelines")
    frozen = cluster.blobnodes[0]
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        [halfway] = blobs_of(cluster, wait_for_put(client, b"deleted halfway" * 1000))
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            tokens = [wait_for_put(client, random.Random(i).randbytes(50_000)) for i in range(4)]
        finally:
            # Resumed as it is, the node would still apply the writes the kernel buffered for it after access
            # gave up on them; a hung node that is restarted loses them, so each object really lacks a shard.
            frozen.kill9()
            frozen.start()
    blobs = [blob for token in tokens for blob in blobs_of(cluster, token)]
    lost = missing_by_blob(cluster, blobs)
    assert {(vid, bid) for vid, bid, _ in lost} == set(blobs)  # each object lacks its frozen node's shard
    mark_deleted(cluster, halfway, units=range(3, 6))  # a tinker that stopped after three of six marks

    record_tasks(cluster)
    backlog_out = tmp_path / "backlog"
    result = blobstore("inspect", "backlog", "--out", str(backlog_out), *kafka, *args)
    assert result.exit_code == 0, result.output
    repairs = summary(backlog_out)["shard_repair"]
    assert repairs["backlog"] == len(blobs) and repairs["paused"] and repairs["disks"] == 1
    assert repairs["rate_per_s"] == 0 and repairs["eta_s"] is None
    assert summary(backlog_out)["blob_delete"]["backlog"] == 0
    tasks = summary(backlog_out)["disk_repair"]
    assert tasks["backlog"] == 1 and tasks["stuck_tasks"] == 1 and tasks["disks"] == 1
    assert tasks["rate_per_s"] == 1 / 3600 and tasks["eta_s"] == 3600
    assert summary(backlog_out)["invalid_task_records"] == 1

    first = tmp_path / "inspect1"
    result = blobstore("inspect", "run", "--out", str(first), "--settle", "0", "--repair", *args)
    assert result.exit_code == 0, result.output
    report = summary(first)
    assert found(first, "missing_shards") == lost
    assert report["missing_shards"] == len(lost) and report["unrecoverable"] == 0 and report["unverified"] == 0
    assert report["queued"] == {"repairs": len(blobs), "deletes": 1}
    assert {(vid, bid) for vid, bid, _ in found(first, "partial_delete")} == {halfway}
    wait_until(lambda: states(cluster, *halfway) == ["missing"] * 6, 60, "the half-done delete finished")
    assert report["disks_unavailable"] == [] and report["bytes_at_risk"] > 0

    assert blobstore("task", "switch", "shard_repair", "on", *args).exit_code == 0
    wait_until(lambda: not missing_by_blob(cluster, blobs), 60, "every lost shard repaired")
    second = tmp_path / "inspect2"
    result = blobstore("inspect", "run", "--out", str(second), "--settle", "0", *args)
    assert result.exit_code == 0, result.output
    assert summary(second)["missing_shards"] == 0 and found(second, "missing_shards") == set()
    for token in tokens:
        assert httpx.get(f"{cluster.access[0].url}/blob/{token}", timeout=30).status_code == 200
