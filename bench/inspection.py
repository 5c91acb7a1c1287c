"""The offline inspection: how fast it scales with cores, and what it does to users while it runs.

scaling: rows per second over a synthetic `--shards` index (generated as the blobnodes export it: per-disk
Parquet files with manifests, clustermgr's unit and disk tables; EC6P3 volumes over 90 disks, 0.1% of blobs
missing a shard, 0.05% partially deleted), on one core (local[1], the process pinned to one CPU) and two
(local[2]), `--pairs` times in turn. Each run is a fresh process (its own JVM: cold, as a real job is); the time
is the job alone (session start excluded). The baseline is the one-core run of the same pair; the goal is >= 1.6x.
Also the JVM's CPU seconds (JIT, GC and planning included) and the driver's peak RSS.

live: a default `cluster up` cluster holding `--fill-mb` of 1 MiB objects serves an open loop of 64 KiB
PUT + GET at `--load` of its measured capacity. User p99 is measured for `--window` seconds alone before and
after (together the baseline), for `--window` seconds beside a control (a CPU-bound process in the idle
scheduling class: on this 2-core VM any neighbour using the spare core inflates p99, whatever it does), and
while `blobstore inspect run --deep --master local[1]` runs, also in the idle class (the export and every shard
read are background I/O on the blobnodes; a real deployment runs Spark on other machines). The goal is p99
during <= 1.5x the baseline; the ratio to the control tells what the inspection's cluster traffic adds.

    python bench/inspection.py [--part scaling|live|both] [--shards 10000000] [--pairs 2]
                               [--out bench/results/inspect.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.availability import Op, phase, stream
from bench.common import cpu_seconds
from bench.repair import MiB, fill, under_load
from blobstore_server.cluster import launcher
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.libs.proto.blobnode import DiskExport
from blobstore_server.libs.proto.export import CHUNK_SCHEMA, SHARD_SCHEMA, chunk_path, shard_path
from blobstore_server.spark.inputs import DISK_SCHEMA, UNIT_SCHEMA

DISKS, UNITS, N = 90, 9, 6  # EC6P3
SETTLE = 10.0  # live: the fill ended longer ago than this before the inspection starts (capacity + baseline)


async def paced_load(access: list[str], rate: float, size: int, running: Callable[[], bool]) -> list[Op]:
    """Open loop: a PUT of `size` bytes then a GET of it, started every 1/`rate` seconds while `running()`, each
    pair through the next access node in turn."""
    ops: list[Op] = []
    rng = random.Random(7)
    start = time.monotonic()

    async def pair(session: aiohttp.ClientSession, url: str) -> None:
        t0 = time.monotonic()
        async with session.put(f"{url}/blob", data=rng.randbytes(size)) as resp:
            ok = resp.status == 200
            token = (await resp.json())["location"] if ok else ""
        ops.append(Op("put", t0 - start, time.monotonic() - t0, ok))
        if ok:
            t1 = time.monotonic()
            async with session.get(f"{url}/blob/{token}") as resp:
                ops.append(Op("get", t1 - start, time.monotonic() - t1, resp.status == 200 and len(await resp.read())
                              == size))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        pending: set[asyncio.Task[None]] = set()
        tick = 0
        while running():
            pending.add(asyncio.create_task(pair(session, access[tick % len(access)])))
            tick += 1
            await asyncio.sleep(max(0.0, start + tick / rate - time.monotonic()))
        await asyncio.gather(*pending)
    return ops



def until(deadline: float) -> bool:
    return time.monotonic() < deadline


def generate(root: Path, shards: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    blobs = shards // UNITS
    volumes = max(1, blobs // 2000)
    now = time.time()
    vids = np.arange(1, volumes + 1)
    placement = np.stack([rng.choice(DISKS, UNITS, replace=False) + 1 for _ in vids])  # disk of each unit
    (root / "cluster").mkdir(parents=True)
    unit_index = np.tile(np.arange(UNITS, dtype=np.int32), volumes)
    unit_disks = placement.reshape(-1)
    pq.write_table(pa.table({
        "vid": np.repeat(vids, UNITS), "unit_index": unit_index, "epoch": np.ones(volumes * UNITS, np.int32),
        "disk_id": unit_disks, "host": [f"http://10.0.0.{d % 30}:8889" for d in unit_disks],
        "code_mode": ["EC6P3"] * (volumes * UNITS), "backend": ["isal"] * (volumes * UNITS),
        "n": np.full(volumes * UNITS, N, np.int32), "total": np.full(volumes * UNITS, UNITS, np.int32),
        "status": ["idle"] * (volumes * UNITS), "migrating": np.zeros(volumes * UNITS, bool),
        "pending": np.zeros(volumes * UNITS, bool)}, schema=UNIT_SCHEMA), root / "cluster" / "units.parquet")
    pq.write_table(pa.table({"disk_id": np.arange(1, DISKS + 1), "host": [f"http://10.0.0.{d % 30}:8889"
                                                                        for d in range(1, DISKS + 1)],
                             "idc": ["z0"] * DISKS, "rack": ["r0"] * DISKS, "status": ["normal"] * DISKS,
                             "alive": np.ones(DISKS, bool)}, schema=DISK_SCHEMA), root / "cluster" / "disks.parquet")
    (root / "cluster" / "manifest.json").write_text(json.dumps({"exported_at": now, "volumes": volumes}))
    blob_vid = rng.integers(1, volumes + 1, blobs)
    bid = np.arange(1, blobs + 1, dtype=np.int64)
    size = rng.integers(1, 64, blobs) * 2048
    rows_vid = np.repeat(blob_vid, UNITS)
    rows_index = np.tile(np.arange(UNITS, dtype=np.int32), blobs)
    keep = np.ones(blobs * UNITS, bool)
    keep[rng.choice(blobs, blobs // 1000, replace=False) * UNITS + rng.integers(0, UNITS)] = False  # a lost shard
    deleted = np.zeros(blobs * UNITS, bool)
    deleted[rng.choice(blobs, blobs // 2000, replace=False) * UNITS] = True  # a delete that stopped half way
    disk = placement[rows_vid - 1, rows_index]
    table = pa.table({"disk_id": disk, "vid": rows_vid, "unit_index": rows_index,
                      "epoch": np.ones(blobs * UNITS, np.int32), "bid": np.repeat(bid, UNITS),
                      "size": np.repeat(size, UNITS), "crc": rng.integers(0, 2**32, blobs * UNITS),
                      "deleted": deleted, "written_at": np.full(blobs * UNITS, int(now) - 86400),
                      "marked_at": np.where(deleted, int(now) - 3600, 0)}, schema=SHARD_SCHEMA).filter(keep)
    for folder in ("shards", "chunks", "manifests"):
        (root / folder).mkdir()
    disks = table.column("disk_id").to_numpy()
    for d in range(1, DISKS + 1):
        part = table.filter(disks == d)
        pq.write_table(part, root / "shards" / f"disk-{d}.parquet", row_group_size=100_000)
        mine = np.nonzero(unit_disks == d)[0]
        pq.write_table(pa.table({"disk_id": np.full(len(mine), d), "vid": mine // UNITS + 1,
                                 "unit_index": (mine % UNITS).astype(np.int32), "epoch": np.ones(len(mine), np.int32),
                                 "chunk_id": [f"{i:032x}" for i in mine], "status": ["normal"] * len(mine),
                                 "created": np.full(len(mine), now - 86400)}, schema=CHUNK_SCHEMA),
                       root / "chunks" / f"disk-{d}.parquet")
        manifest = DiskExport(disk_id=d, host=f"http://10.0.0.{d % 30}:8889", started=now, finished=now,
                              shard_file=shard_path(d), shards=part.num_rows,
                              chunk_file=chunk_path(d), chunks=len(mine))
        (root / "manifests" / f"disk-{d}.json").write_text(manifest.model_dump_json())


def _driver_jvm() -> int:
    """The JVM pyspark started for this process."""
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text() if proc.name.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and "(java)" in stat:
            return int(proc.name)
    raise RuntimeError("no JVM child found")


def _peak_rss(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) << 10


def measure(master: str, source: str, out: str) -> dict[str, float]:
    """In this process (a fresh JVM, so the run is cold as a real job's is): the job's wall time and the CPU the
    JVM spent (tasks, and the JIT compilers, GC and planning that run beside them); local[1] is pinned to one CPU,
    or those threads would take the second core for free and it would not be a one-core run."""
    from blobstore_server.spark.inputs import load_inputs
    from blobstore_server.spark.inspect import InspectOptions, inspect
    from blobstore_server.spark.session import spark_session

    if master == "local[1]":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    inputs = load_inputs(source)
    with spark_session(master, "bench-inspect", {"spark.ui.enabled": "false", "spark.driver.memory": "3g",
                                                 "spark.ui.showConsoleProgress": "false",
                                                 "spark.sql.shuffle.partitions": "16"}) as spark:
        spark.range(1000).count()  # the session is up before the clock starts
        jvm = _driver_jvm()
        cpu, start = cpu_seconds(jvm), time.perf_counter()
        summary = inspect(spark, inputs, out, InspectOptions(settle=0))
        seconds, cpu = time.perf_counter() - start, cpu_seconds(jvm) - cpu
        rss = _peak_rss(jvm)
    return {"seconds": round(seconds, 2), "jvm_cpu_s": round(cpu, 1), "driver_peak_rss_mb": rss >> 20,
            "rows": summary["shards_scanned"], "missing": summary["missing_shards"]}


def scaling(shards: int, pairs: int) -> dict[str, Any]:
    """`pairs` alternating cold runs on one core (local[1]) and two (local[2]); the median of each pair's ratio."""
    runs: dict[str, list[dict[str, Any]]] = {"local[1]": [], "local[2]": []}
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as tmp:
        t0 = time.perf_counter()
        generate(Path(tmp, "input"), shards)
        generated = round(time.perf_counter() - t0, 1)
        for _ in range(pairs):
            for master, done in runs.items():
                child = subprocess.run([sys.executable, __file__, "--measure",
                                        f"{master},{tmp}/input,{tmp}/out-{master[6]}"], capture_output=True, text=True)
                if child.returncode != 0:
                    raise SystemExit(f"{master} failed:\n{child.stderr[-3000:]}")
                done.append(json.loads(child.stdout.strip().splitlines()[-1]))
    results: dict[str, Any] = {"shards": shards, "generate_s": generated, "pairs": pairs}
    for master, done in runs.items():
        cores = int(master[6])
        seconds = statistics.median(r["seconds"] for r in done)
        results[master] = {"runs": done, "median_s": seconds, "rows_per_s": round(done[0]["rows"] / seconds),
                           "rows_per_s_per_core": round(done[0]["rows"] / seconds / cores),
                           "rows_per_cpu_s": round(done[0]["rows"] / statistics.median(r["jvm_cpu_s"] for r in done)),
                           "driver_peak_rss_mb": max(r["driver_peak_rss_mb"] for r in done)}
    results["scaling"] = round(statistics.median(one["seconds"] / two["seconds"] for one, two in zip(
        runs["local[1]"], runs["local[2]"], strict=True)), 2)
    return results


def _idle() -> None:
    """Run the calling (child) process in the idle scheduling class: it gets a core only when nothing else wants it."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _inspection(root: Path, out: Path, log: Path) -> subprocess.Popen[bytes]:
    """`inspect run --deep` in the idle class; blobs written in the last SETTLE seconds (the user load's) are
    skipped."""
    command = [str(Path(sys.executable).with_name("blobstore")), "inspect", "run", "--deep", "--settle", str(SETTLE),
               "--master", "local[1]", "--conf", "spark.sql.shuffle.partitions=4", "--conf",
               "spark.ui.showConsoleProgress=false", "--out", str(out), "--dir", str(root)]
    with open(log, "wb") as stderr:
        return subprocess.Popen(command, stdout=stderr, stderr=subprocess.STDOUT, preexec_fn=_idle)


def live(fill_mb: int, load: float, window: float) -> dict[str, Any]:
    """User p99 without anything else (before and after: the baseline), beside a CPU-bound idle-class process
    (the control: what any neighbour using the spare core does to latency on this box), and during the
    inspection."""
    size = 64 << 10
    with tempfile.TemporaryDirectory(prefix="bench-inspect-live-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape())
        try:
            stored = asyncio.run(fill(info.access_urls, fill_mb * MiB, MiB))
            filled = time.monotonic()
            closed, _ = asyncio.run(stream(info.access_urls, 4, size, 4.0, 0.0, lambda: None))
            rate = load * sum(o.kind == "put" for o in closed) / 4.0

            def load_for(seconds: float) -> list[Op]:
                return asyncio.run(paced_load(info.access_urls, rate, size, partial(until, time.monotonic() + seconds)))

            baseline = load_for(window)
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_idle)
            try:
                control = load_for(window)
            finally:
                hog.kill()
                hog.wait()
            time.sleep(max(0.0, filled + SETTLE + 1 - time.monotonic()))
            started = time.monotonic()
            log = Path(tmp) / "inspect.log"
            job = _inspection(root, Path(tmp) / "inspect", log)
            during = asyncio.run(paced_load(info.access_urls, rate, size, lambda: job.poll() is None))
            seconds = time.monotonic() - started
            if job.returncode != 0:
                raise SystemExit(f"the inspection exited {job.returncode}:\n{log.read_text()[-3000:]}")
            baseline += load_for(window)
            report = json.loads((Path(tmp) / "inspect" / "summary.json").read_text())
        finally:
            launcher.down(root)
    result = under_load({"stored_objects": stored, "object_size": MiB, "shards_read": report["shards_scanned"],
                         "inspection_s": round(seconds, 1), "user_size": size,
                         "user_load_pairs_per_s": round(rate, 1), "corrupt_shards": report["corrupt_shards"]},
                        baseline, during)
    for kind in ("put", "get"):
        result["user"][kind]["control"] = phase(control, kind, -1e9, 1e9)
    result["control_over_baseline"] = {k: round(result["user"][k]["control"]["p99_ms"] /
                                                result["user"][k]["baseline"]["p99_ms"], 2) for k in ("put", "get")}
    result["p99_during_over_control"] = {k: round(result["user"][k]["during"]["p99_ms"] /
                                                  result["user"][k]["control"]["p99_ms"], 2) for k in ("put", "get")}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["scaling", "live", "both"], default="both")
    parser.add_argument("--shards", type=int, default=10_000_000)
    parser.add_argument("--pairs", type=int, default=2, help="alternating local[1] / local[2] runs (scaling)")
    parser.add_argument("--fill-mb", type=int, default=400)
    parser.add_argument("--load", type=float, default=0.33, help="user load as a share of the measured capacity")
    parser.add_argument("--window", type=float, default=15.0, help="seconds of each baseline and control window")
    parser.add_argument("--out", default="bench/results/inspect.json")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: MASTER,INPUT,OUT in a child process
    args = parser.parse_args()
    if args.measure:
        master, source, out = args.measure.split(",")
        print(json.dumps(measure(master, source, out)))
        return 0
    results: dict[str, Any] = {}
    lines = []
    if args.part in ("scaling", "both"):
        results["scaling"] = found = scaling(args.shards, args.pairs)
        one, two = found["local[1]"], found["local[2]"]
        lines.append(f"{args.shards:,} shards: one core {one['rows_per_s']:,} rows/s, two {two['rows_per_s']:,} "
                     f"rows/s, scaling x{found['scaling']} (goal >= 1.6); driver peak {two['driver_peak_rss_mb']} MB")
    if args.part in ("live", "both"):
        results["live"] = run = live(args.fill_mb, args.load, args.window)
        ratio, control, net = (run[k] for k in ("p99_during_over_baseline", "control_over_baseline",
                                                 "p99_during_over_control"))
        lines.append(f"--deep over {run['shards_read']:,} shards took {run['inspection_s']:.0f} s; user p99 during "
                     f"it: PUT {ratio['put']:.2f}x GET {ratio['get']:.2f}x the baseline (goal <= 1.5), "
                     f"{net['put']:.2f}x / {net['get']:.2f}x the control (an idle-class CPU hog: "
                     f"{control['put']:.2f}x / {control['get']:.2f}x)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print("inspect: " + "; ".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
