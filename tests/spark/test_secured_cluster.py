"""Both jobs on a default `cluster up` cluster (signed requests; 6 blobnodes x 2 disks, EC3P3) holding real
damage: shards missed while a blobnode was killed -9 (then restarted), a byte flipped on disk, a byte flipped with
its block CRC rewritten to match, a chunk no volume names. Shard repair is switched off, so the repair messages
access queued for the missed shards wait in Kafka.

`inspect run --deep` finds all of it on local Spark (in this process) and on a standalone master (the `blobstore`
command as a user runs it), and `inspect backlog` counts the waiting messages there. The executors' read grant
never shows on a command line, in a process environment, a log or Spark's status pages; a job whose reads or
repairs the cluster refuses exits 3 and concludes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from blobstore import Client
from blobstore_server.cli.shards import inspect_shards
from blobstore_server.cluster.launcher import SECRET_FILE, ClusterInfo, ProcessRecord, restart
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.switches import OFF, TaskType, switch_key
from blobstore_server.libs.rpc.auth import AuthConfig, Grant
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.tinker.client import TinkerClient
from deploy.spark import standalone
from tests.support.damage import flip_a_byte
from tests.support.launched import Launch
from tests.support.processes import wait_until
from tests.support.spark import blobstore, found, summary

# The launched `cluster` (tests/conftest.py), its own (the module damages it); blobnodes may export inspections into
# the temporary folders the tests collect them in
LAUNCH = Launch(ClusterShape(export_roots=(tempfile.gettempdir(),)), timeout=90, owner=__name__)
BLOBSTORE = str(Path(sys.executable).with_name("blobstore"))
ORPHAN_VID = 900_000
GRANT_TTL = 3600


@dataclass(frozen=True)
class Damaged:
    info: ClusterInfo
    corrupt: tuple[int, int, int]  # (vid, bid, unit index) whose first block fails its CRC
    rewritten: tuple[int, int]  # (vid, bid) one of whose parity shards holds other bytes under a valid CRC
    missing: set[tuple[int, int, int]]  # shards written while their blobnode was down

    @property
    def root(self) -> Path:
        return Path(self.info.dir)

    def process(self, name: str) -> ProcessRecord:
        return next(p for p in ClusterInfo.load(self.root).processes if p.name == name)


def _repair_paused(info: ClusterInfo) -> bool:
    async def ask() -> bool:
        async with TinkerClient() as tinker:
            stats = await tinker.stats(next(p.url for p in info.processes if p.role == "tinker"))
        return stats.pipelines["repair"].paused and stats.pipelines["repair_prior"].paused

    return asyncio.run(ask())


def _kill(record: ProcessRecord) -> None:
    os.kill(record.pid, signal.SIGKILL)
    wait_until(lambda: not record.running, 10, f"{record.name} to die")


def _damage(info: ClusterInfo) -> Damaged:
    root = Path(info.dir)

    async def switch_off() -> None:  # nothing may repair, move or re-queue what the jobs must find
        async with ClusterClient(info.clustermgr_urls) as cm:
            for task in (TaskType.SHARD_REPAIR, TaskType.VOLUME_INSPECT, TaskType.BALANCE):
                await cm.set_config(switch_key(task), OFF)

    asyncio.run(switch_off())
    wait_until(lambda: _repair_paused(info), 20, "tinker to pause its repair pipelines")
    with Client(info.access_urls) as client:
        kept = [client.put(random.Random(i).randbytes(40_000)) for i in range(4)]
        victim = next(p for p in info.processes if p.name == "blobnode3")
        _kill(victim)
        hurt = [client.put(random.Random(100 + i).randbytes(40_000)) for i in range(5)]
        restart(root, "blobnode3")
        stats = [client.stat(location) for location in kept + hurt]

    async def look() -> tuple[set[tuple[int, int, int]], Unit, Unit]:
        async with ClusterClient(info.clustermgr_urls) as cm, BlobnodeClient() as bn:
            reports = [r for stat in stats for r in await inspect_shards(stat, cm, bn)]
            host = next(p.url for p in info.processes if p.name == "blobnode1")
            disk = next(d for d in await cm.list_disks() if d.host == host)
            await bn.create_chunk(disk.host, disk.disk_id, Vuid.make(ORPHAN_VID, 0, 1))
            return ({(r.vid, r.bid, r.index) for r in reports if r.state == "missing"},
                    (await cm.get_volume(a[0])).units[1], (await cm.get_volume(b[0])).units[4])

    a, b = [(s.blobs[0].vid, s.blobs[0].min_bid) for s in stats[:2]]
    missing, corrupt_unit, rewritten_unit = asyncio.run(look())
    flip_a_byte(corrupt_unit, a[1])
    flip_a_byte(rewritten_unit, b[1], keep_crc=True)
    corrupt = (*a, 1)
    assert {(v, b) for v, b, _ in missing} == {(s.blobs[0].vid, s.blobs[0].min_bid) for s in stats[len(kept):]}
    return Damaged(ClusterInfo.load(root), corrupt, b, missing)


@pytest.fixture(scope="module")
def damaged(cluster: ClusterInfo) -> Damaged:
    return _damage(cluster)


def assert_everything_found(out: Path, damaged: Damaged) -> None:
    report = summary(out)
    assert found(out, "corrupt_shards") == {damaged.corrupt}
    assert {(vid, bid) for vid, bid, _ in found(out, "parity_mismatch")} == {damaged.rewritten}
    assert found(out, "missing_shards") == damaged.missing
    assert ORPHAN_VID in {vid for vid, _, _ in found(out, "orphan_units")}
    assert report["unrecoverable"] == 0 and report["unread_shards"] == 0 and report["disks_unavailable"] == []
    assert report["blobs_scanned"] >= 9 and report["deep"]


def test_deep_inspection_on_local_spark_finds_every_kind_of_damage(damaged: Damaged, spark: SparkSession,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "local"
    result = blobstore("inspect", "run", "--deep", "--settle", "0", "--out", str(out), "--dir", str(damaged.root))
    assert result.exit_code == 0, result.output
    assert_everything_found(out, damaged)


class ProcessWatch:
    """Every command line and environment of every process, sampled while the block runs."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for proc in Path("/proc").iterdir():
                for name in ("cmdline", "environ"):
                    try:
                        self.seen.add((proc / name).read_bytes().decode(errors="replace"))
                    except OSError:
                        continue

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def secret_material(root: Path, first: float, last: float) -> list[str]:
    """The cluster secret, every role key, and every read grant key the job could have made in [first, last]."""
    secret = (root / SECRET_FILE).read_text().strip()
    keys = AuthConfig.for_capabilities(secret, Capability).keys
    grants = [Grant.of(Capability.READ_SHARD, bytes.fromhex(keys[Capability.READ_SHARD]), expires).key
              for expires in range(int(first) + GRANT_TTL - 2, int(last) + GRANT_TTL + 2)]
    return [secret, *keys.values(), *grants]


def _json(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


@pytest.mark.timeout(600)  # two jobs, each starting its driver and executor JVMs on a 2-core box
def test_standalone_master_inspects_and_counts_the_backlog_and_the_grant_never_leaks(damaged: Damaged,
                                                                                     tmp_path: Path) -> None:
    spark_dir = tmp_path / "spark"
    master = standalone.start(spark_dir, cores=2, memory="1g")
    no_jars = tmp_path / "empty-cache"  # `inspect run` needs no jar beyond pyspark's and fetches none
    no_jars.mkdir()
    try:
        common = ["--master", master.master_url, "--conf", "spark.sql.shuffle.partitions=4",
                  "--conf", "spark.executor.memory=512m", "--dir", str(damaged.root)]
        with ProcessWatch() as watch:
            first = time.time()
            inspected = subprocess.run([BLOBSTORE, "inspect", "run", "--deep", "--settle", "0", "--grant-ttl",
                                        str(GRANT_TTL), "--out", str(tmp_path / "inspect"), *common],
                                       env={**os.environ, "BLOBSTORE_CACHE": str(no_jars)},
                                       capture_output=True, text=True, timeout=240)
            last = time.time()
            backlog = subprocess.run([BLOBSTORE, "inspect", "backlog", "--json", "--out", str(tmp_path / "backlog"),
                                      *common], capture_output=True, text=True, timeout=240)
        assert inspected.returncode == 0, inspected.stderr[-3000:]
        assert_everything_found(tmp_path / "inspect", damaged)
        assert list(no_jars.iterdir()) == []

        assert backlog.returncode == 0, backlog.stderr[-3000:]
        repairs = json.loads(backlog.stdout)["shard_repair"]
        assert repairs["backlog"] == len({(vid, bid) for vid, bid, _ in damaged.missing}) and repairs["paused"]
        assert repairs["rate_per_s"] == 0 and repairs["stalled"] is False

        state = json.loads(_json(f"{master.ui_url}/json/"))
        assert {app["name"] for app in state["completedapps"]} == {"blobstore-inspect", "blobstore-backlog"}
        pages = [_json(f"{master.ui_url}/json/"), *(_json(f"{w['webuiaddress']}/json/") for w in state["workers"])]
        logs = [f.read_text(errors="replace") for f in spark_dir.rglob("*") if f.is_file()]
        texts = [inspected.stdout, inspected.stderr, backlog.stdout, backlog.stderr, *pages, *logs, *watch.seen]
        assert any("pyspark" in text for text in watch.seen)  # the watch saw the job's processes
        for secret in secret_material(damaged.root, first, last):
            assert not any(secret in text for text in texts)
    finally:
        standalone.stop(spark_dir)


def _restart_with(damaged: Damaged, name: str, change: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    """Restart process `name` with `change` made to its auth config; returns what puts it back as it was."""
    record = damaged.process(name)
    path = Path(record.config)
    before = path.read_text()
    config = json.loads(before)
    change(config["auth"])
    path.write_text(json.dumps(config))
    _kill(record)
    restart(damaged.root, name)

    def undo() -> None:
        path.write_text(before)
        _kill(damaged.process(name))
        restart(damaged.root, name)

    return undo


def test_refused_reads_and_refused_repairs_fail_the_job_with_exit_3(damaged: Damaged, spark: SparkSession,
                                                                     tmp_path: Path) -> None:
    node = damaged.process("blobnode2")
    # a config from before grants
    undo = _restart_with(damaged, node.name, lambda auth: auth["keys"].pop(Capability.READ_SHARD.value))
    out = tmp_path / "refused-reads"
    try:
        result = blobstore("inspect", "run", "--deep", "--settle", "0", "--out", str(out), "--dir", str(damaged.root))
    finally:
        undo()
    assert result.exit_code == 3, result.output
    assert "shard reads refused" in result.output and node.url in result.output and "read" in result.output
    assert not (out / "summary.json").exists()  # nothing concluded, above all not "no corrupt shard"

    # A mqproxy that takes no signature at all, as if every caller's clock were off: it still registers (its own
    # calls are signed), but the job's repair messages are refused.
    undo = _restart_with(damaged, "mqproxy", lambda auth: auth.update(window=1e-9))
    try:
        result = blobstore("inspect", "run", "--repair", "--settle", "0", "--out", str(tmp_path / "refused-repairs"),
                           "--dir", str(damaged.root))
    finally:
        undo()
    assert result.exit_code == 3, result.output
    assert "refused" in result.output and "outside the 0s window" in result.output
