"""Both jobs, unchanged, on a real Spark standalone cluster (a master and a worker started from pyspark's own
jars on 127.0.0.1, stopped by PID), run by the `blobstore` command as a user would, against a cluster with
no objects yet and a few scheduler task records."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from deploy.spark import standalone
from libs.proto.scheduler import TaskRecord, TaskState
from libs.proto.switches import TaskType
from services.clustermgr.client import ClusterClient
from tests.spark.conftest import cluster_args, summary
from tests.support.processes import LocalCluster

ClusterFactory = Callable[..., LocalCluster]
BLOBSTORE = str(Path(sys.executable).with_name("blobstore"))


def record_tasks(cluster: LocalCluster) -> None:
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


def test_inspection_and_backlog_run_on_a_standalone_master(cluster_factory: ClusterFactory, tmp_path: Path) -> None:
    cluster = cluster_factory(pipelines=True)
    record_tasks(cluster)
    tinker = cluster.background["tinker"].config
    spark_dir = tmp_path / "spark"
    master = standalone.start(spark_dir, cores=2, memory="1g")
    try:
        common = ["--master", master.master_url, "--conf", "spark.sql.shuffle.partitions=4",
                  "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m", *cluster_args(cluster)]
        inspected = subprocess.run([BLOBSTORE, "inspect", "run", "--out", str(tmp_path / "inspect"), "--settle", "0",
                                    *common], capture_output=True, text=True, timeout=300)
        assert inspected.returncode == 0, inspected.stderr[-3000:]
        assert "inspection findings" in inspected.stdout and "[Stage" in inspected.stderr  # progress, then summary
        report = summary(tmp_path / "inspect")
        assert report["blobs_scanned"] == 0 and report["disks_unavailable"] == []
        assert not any(report[k] for k in ("missing_shards", "unrecoverable", "orphan_units", "partial_delete"))

        backlog = subprocess.run([BLOBSTORE, "inspect", "backlog", "--out", str(tmp_path / "backlog"), "--json",
                                  "--kafka", tinker["kafka_bootstrap"], "--cluster-id", str(tinker["cluster_id"]),
                                  "--group-prefix", tinker["group_prefix"], *common],
                                 capture_output=True, text=True, timeout=300)
        assert backlog.returncode == 0, backlog.stderr[-3000:]
        found = summary(tmp_path / "backlog")
        assert json.loads(backlog.stdout) == found
        assert found["shard_repair"]["backlog"] == 0 and found["blob_delete"]["backlog"] == 0
        repairs = found["disk_repair"]
        assert repairs["backlog"] == 1 and repairs["stuck_tasks"] == 1 and repairs["disks"] == 1
        assert repairs["rate_per_s"] == 1 / 3600 and repairs["eta_s"] == 3600
        assert found["invalid_task_records"] == 1

        with urllib.request.urlopen(f"{master.ui_url}/json/", timeout=5) as answer:
            apps = {app["name"] for app in json.load(answer)["completedapps"]}
        assert apps == {"blobstore-inspect", "blobstore-backlog"}  # they really ran on the standalone master
    finally:
        standalone.stop(spark_dir)
