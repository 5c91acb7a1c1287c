"""Rows per second of the offline inspection over a synthetic 10-million-shard index, on local[1] and local[2].

The index is generated as the blobnodes export it (per-disk Parquet files with manifests, clustermgr's unit and
disk tables): EC6P3 volumes over 90 disks, 0.1% of blobs missing a shard, 0.05% partially deleted. Each master
runs in a fresh process (its own JVM); the time is the job alone (session start excluded), best of `--runs`.
local[1] is the baseline of the same run; the goal is >= 1.6x from 1 to 2 cores.

    python bench/inspect.py [--shards 10000000] [--runs 1] [--out bench/results/inspect.json]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path and its name would shadow the standard
# library's `inspect` for every module imported below: take the folder off the path first.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from libs.proto.blobnode import DiskExport  # noqa: E402
from services.blobnode.export import CHUNK_SCHEMA, SHARD_SCHEMA  # noqa: E402
from spark.inputs import DISK_SCHEMA, UNIT_SCHEMA  # noqa: E402

DISKS, UNITS, N = 90, 9, 6  # EC6P3


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
                              shard_file=f"shards/disk-{d}.parquet", shards=part.num_rows,
                              chunk_file=f"chunks/disk-{d}.parquet", chunks=len(mine))
        (root / "manifests" / f"disk-{d}.json").write_text(manifest.model_dump_json())


def measure(master: str, source: str, out: str, runs: int) -> dict[str, float]:
    """In this process: the job's wall time on `master`, best of `runs`."""
    from spark.inputs import load_inputs
    from spark.inspect import InspectOptions, inspect
    from spark.session import spark_session

    inputs = load_inputs(source)
    best = float("inf")
    with spark_session(master, "bench-inspect", {"spark.ui.enabled": "false", "spark.driver.memory": "3g",
                                                 "spark.ui.showConsoleProgress": "false",
                                                 "spark.sql.shuffle.partitions": "16"}) as spark:
        spark.range(1000).count()  # the session is up before the clock starts
        for _ in range(runs):
            start = time.perf_counter()
            summary = inspect(spark, inputs, out, InspectOptions(settle=0))
            best = min(best, time.perf_counter() - start)
    return {"seconds": round(best, 2), "rows": summary["shards_scanned"], "missing": summary["missing_shards"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", default="bench/results/inspect.json")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: MASTER,INPUT,OUT in a child process
    args = parser.parse_args()
    if args.measure:
        master, source, out = args.measure.split(",")
        print(json.dumps(measure(master, source, out, args.runs)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as tmp:
        t0 = time.perf_counter()
        generate(Path(tmp, "input"), args.shards)
        generated = time.perf_counter() - t0
        results: dict[str, object] = {"shards": args.shards, "generate_s": round(generated, 1)}
        for master in ("local[1]", "local[2]"):
            child = subprocess.run([sys.executable, __file__, "--runs", str(args.runs), "--measure",
                                    f"{master},{tmp}/input,{tmp}/out-{master[6]}"], capture_output=True, text=True)
            if child.returncode != 0:
                raise SystemExit(f"{master} failed:\n{child.stderr[-3000:]}")
            found = json.loads(child.stdout.strip().splitlines()[-1])
            found["rows_per_s"] = round(found["rows"] / found["seconds"])
            results[master] = found
    one, two = results["local[1]"], results["local[2]"]
    assert isinstance(one, dict) and isinstance(two, dict)
    results["scaling"] = round(two["rows_per_s"] / one["rows_per_s"], 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"inspect: {args.shards} shards, local[1] {one['rows_per_s']:,} rows/s, local[2] {two['rows_per_s']:,} "
          f"rows/s, scaling x{results['scaling']} (goal >= 1.6)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
