"""Rebuild throughput of one disk, next to the raw write bandwidth of the same filesystem, and what the
rebuild does to user PUT/GET latency.

Brings a cluster up with the launcher (3 clustermgr, `--blobnodes` x 2 disks, EC3P3), stores `--fill-mb`
of `--fill-size` objects, then:
1. raw: `--raw-mb` of 1 MiB os.pwrite + fdatasync, 4 threads, into a file beside the cluster's disks;
2. alone: every unit of the fullest disk is rebuilt onto a new chunk (clustermgr unit alloc + blobnode
   chunk create, then the worker's `UnitMigrator` with the source unreadable, as for a broken disk), all
   units at once, in a separate process (as a worker would be), with no user traffic;
3. before: `--clients` loops of PUT + GET of `--size` bytes for `--before` seconds (the p99 baseline);
4. during: the same loops while the next fullest disk (on another host) is rebuilt the same way.
Reports rebuilt MB/s over raw MB/s (goal >= 0.5) and user p99 during over before (goal <= 1.5). Blobnodes
run with their default background cap (64 MiB/s and 4 requests per disk). Writes JSON, prints one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.availability import Op, phase, stream
from bench.common import summarize
from blobstore import launcher
from blobstore.plan import ClusterShape
from libs.proto.cluster import Unit
from libs.proto.scheduler import TaskProgress, TaskRef, WorkTask
from libs.proto.switches import TaskType
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from services.worker.config import WorkerConfig
from services.worker.migrate import UnitMigrator

MiB = 1 << 20


def raw_write(directory: Path, total: int, piece: int = MiB, threads: int = 4) -> dict[str, float]:
    """Durable 1 MiB writes (pwrite + fdatasync), as a blobnode does them, `threads` at a time."""
    data = os.urandom(piece)
    fd = os.open(directory / "raw-write", os.O_RDWR | os.O_CREAT, 0o644)
    latencies: list[float] = []

    def one(i: int) -> None:
        t0 = time.perf_counter()
        os.pwrite(fd, data, i * piece)
        os.fdatasync(fd)
        latencies.append(time.perf_counter() - t0)

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(total // piece)))
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(directory / "raw-write")
    return summarize(latencies, elapsed, piece)


async def fill(access: str, total: int, size: int, clients: int = 8) -> int:
    """PUT `total` bytes of `size`-byte objects; returns how many were stored."""
    count = total // size
    stored = 0
    todo = iter(range(count))

    async def loop(session: aiohttp.ClientSession, seed: int) -> None:
        nonlocal stored
        rng = random.Random(seed)
        for _ in todo:
            async with session.put(f"{access}/blob", data=rng.randbytes(size)) as resp:
                stored += resp.status == 200

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(loop(session, s) for s in range(clients)))
    return stored


Held = list[tuple[int, int, Unit]]  # (vid, index, unit)


async def fullest_disks(cm_urls: list[str]) -> tuple[Held, Held]:
    """The units of the two disks (on different hosts) holding the most data."""
    async with ClusterClient(cm_urls) as cm, BlobnodeClient() as bn:
        volumes = await cm.list_volumes()
        held = [(v.vid, i, u) for v in volumes for i, u in enumerate(v.units)]
        used = await asyncio.gather(*(bn.chunk_stat(u.host, u.disk_id, u.vuid) for _, _, u in held))
    per_disk: Counter[int] = Counter()
    for (_, _, unit), stat in zip(held, used, strict=True):
        per_disk[unit.disk_id] += stat.live_bytes
    host = {u.disk_id: u.host for _, _, u in held}
    first = per_disk.most_common(1)[0][0]
    second = next(d for d, _ in per_disk.most_common() if host[d] != host[first])
    return [h for h in held if h[2].disk_id == first], [h for h in held if h[2].disk_id == second]


def rebuild_disk(cm_urls: list[str], units: Held) -> dict[str, float]:
    """In its own process: rebuild every unit of the disk onto new chunks at once; bytes, shards, seconds."""
    os.nice(10)
    async def run() -> dict[str, float]:
        config = WorkerConfig(clustermgr_hosts=cm_urls)
        async with ClusterClient(cm_urls) as cm, BlobnodeClient() as bn:
            migrator = UnitMigrator(cm, bn, config)

            async def noop(_: TaskProgress) -> None:
                return None

            async def one(vid: int, index: int, source: Unit) -> TaskProgress:
                destination = await cm.alloc_unit(vid, index)
                await bn.create_chunk(destination.host, destination.disk_id, destination.vuid)
                ref = TaskRef(task_type=TaskType.DISK_REPAIR, task_id=f"bench-{vid}-{index}", worker="bench",
                              source_vuid=source.vuid, destination_vuid=destination.vuid)
                task = WorkTask(ref=ref, vid=vid, unit_index=index, source=source, destination=destination,
                                source_readable=False, lease_ttl=60)
                return await migrator.migrate(task, noop)

            start = time.perf_counter()
            done = await asyncio.gather(*(one(*u) for u in units))
            elapsed = time.perf_counter() - start
        return {"bytes": sum(p.done_bytes for p in done), "shards": sum(p.done_shards for p in done),
                "seconds": elapsed, "rebuilt_shards": migrator.stats.rebuilt_shards}

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blobnodes", type=int, default=7)
    parser.add_argument("--fill-mb", type=int, default=400)
    parser.add_argument("--fill-size", type=int, default=MiB)
    parser.add_argument("--raw-mb", type=int, default=256)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--before", type=float, default=10.0)
    parser.add_argument("--out", default="bench/results/repair.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(blobnodes=args.blobnodes))
        try:
            stored = asyncio.run(fill(info.access_url, args.fill_mb * MiB, args.fill_size))
            raw = raw_write(root, args.raw_mb * MiB)
            units, loaded_units = asyncio.run(fullest_disks(info.clustermgr_urls))
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                rebuilt = pool.submit(rebuild_disk, info.clustermgr_urls, units).result()
                before, _ = asyncio.run(stream(info.access_url, args.clients, args.size, args.before, 0.0,
                                               lambda: None))
                rebuild = pool.submit(rebuild_disk, info.clustermgr_urls, loaded_units)

                async def during_rebuild() -> list[Op]:
                    ops: list[Op] = []
                    while not rebuild.done():
                        more, _ = await stream(info.access_url, args.clients, args.size, 2.0, 0.0, lambda: None)
                        ops += more
                    return ops

                during = asyncio.run(during_rebuild())
                loaded = rebuild.result()
        finally:
            launcher.down(root)
    rebuilt_mb_s = rebuilt["bytes"] / rebuilt["seconds"] / 1e6
    loaded_mb_s = loaded["bytes"] / loaded["seconds"] / 1e6
    disk, loaded_disk = units[0][2].disk_id, loaded_units[0][2].disk_id
    user = {k: {"before": phase(before, k, -1e9, 1e9), "during": phase(during, k, -1e9, 1e9)} for k in ("put", "get")}
    ratios = {k: round(user[k]["during"]["p99_ms"] / user[k]["before"]["p99_ms"], 2) for k in user}
    result = {
        "shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, EC3P3, background cap 64 MiB/s x 4 per disk",
        "stored_objects": stored, "object_size": args.fill_size, "disk": disk, "units": len(units),
        "rebuilt_bytes": rebuilt["bytes"], "rebuilt_shards": rebuilt["shards"],
        "rebuild_seconds": round(rebuilt["seconds"], 2), "rebuilt_mb_per_s": round(rebuilt_mb_s, 1),
        "raw_write": raw, "rebuild_over_raw": round(rebuilt_mb_s / raw["mb_per_s"], 2),
        "under_load": {"disk": loaded_disk, "units": len(loaded_units), "rebuilt_bytes": loaded["bytes"],
                       "rebuilt_shards": loaded["shards"], "rebuild_seconds": round(loaded["seconds"], 2),
                       "rebuilt_mb_per_s": round(loaded_mb_s, 1)},
        "user_clients": args.clients, "user_size": args.size, "user": user, "p99_during_over_before": ratios,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"repair: disk {disk} ({len(units)} units, {rebuilt['shards']} shards, {rebuilt['bytes'] / 1e6:.0f} MB) "
          f"rebuilt at {rebuilt_mb_s:.1f} MB/s vs raw durable write {raw['mb_per_s']:.1f} MB/s "
          f"= {result['rebuild_over_raw']:.2f}x (goal >= 0.5); under user load {loaded_mb_s:.1f} MB/s, "
          f"user p99 during/before: PUT {ratios['put']:.2f}x "
          f"({user['put']['before']['p99_ms']:.0f} -> {user['put']['during']['p99_ms']:.0f} ms), "
          f"GET {ratios['get']:.2f}x ({user['get']['before']['p99_ms']:.0f} -> "
          f"{user['get']['during']['p99_ms']:.0f} ms) (goal <= 1.5)")


if __name__ == "__main__":
    main()
