"""Rebuild throughput of one disk, next to the raw write bandwidth of the same filesystem, and what the
rebuild does to user PUT/GET latency.

Brings a cluster up with the launcher (3 clustermgr, `--blobnodes` x 2 disks, two allocators, two access
nodes, EC3P3; user requests spread over both access nodes), stores `--fill-mb` of `--fill-size` objects, then:
1. raw: `--raw-mb` of 1 MiB os.pwrite + fdatasync, 4 threads, into a file beside the cluster's disks;
2. alone: every unit of the fullest disk is rebuilt onto a new chunk (clustermgr unit alloc + blobnode
   chunk create, then the worker's `UnitMigrator` with the source unreadable, as for a broken disk), all
   units at once, in a separate process (as a worker would be), with no user traffic;
3. capacity: `--clients` closed loops of PUT + GET of `--size` bytes for a few seconds; the user load is
   then an open loop at `--load` of that rate (a box with headroom, as production runs), whose p99 is
   measured for `--baseline` seconds before and again after the loaded rebuilds (the baseline: both
   windows, so neighbours' load drifting during the run biases it less), and
4. during: the same load while the next fullest disk (on another host) is rebuilt the same way, then
   while a third one is rebuilt by a worker capped at `--worker-cap` MiB/s (`migrate_mb_per_sec`).
5. node loss: `disk_broken_after` is set to `--broken-after` seconds and the blobnode holding the most units is
   killed -9 and left down; the scheduler notices, and its worker rebuilds every unit of both disks. Reports
   the time from the kill to full redundancy (every disk of the node repaired), how much of it was
   detection, and the MB/s rebuilt through the scheduler and worker.
Reports rebuilt MB/s over raw MB/s (goal >= 0.5) and user p99 during over baseline (goal <= 1.5). Blobnodes
run with their default background cap (64 MiB/s and 4 requests per disk). `--node-loss-only` runs the fill,
the raw writes and section 5 alone. Writes JSON, prints one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.availability import Op, phase, stream
from bench.common import summarize
from blobstore import launcher
from blobstore.plan import ClusterShape
from libs.proto.cluster import DiskStatus, Unit
from libs.proto.scheduler import BROKEN_AFTER_KEY, TASK_PREFIX, TaskProgress, TaskRecord, TaskRef, WorkTask
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


async def fill(access: list[str], total: int, size: int, clients: int = 8) -> int:
    """PUT `total` bytes of `size`-byte objects, loop i through access node i mod len(access); returns how many
    were stored."""
    count = total // size
    stored = 0
    todo = iter(range(count))

    async def loop(session: aiohttp.ClientSession, seed: int) -> None:
        nonlocal stored
        rng = random.Random(seed)
        url = access[seed % len(access)]
        for _ in todo:
            async with session.put(f"{url}/blob", data=rng.randbytes(size)) as resp:
                stored += resp.status == 200

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(loop(session, s) for s in range(clients)))
    return stored


Held = list[tuple[int, int, Unit]]  # (vid, index, unit)


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


async def fullest_disks(cm_urls: list[str], count: int) -> list[Held]:
    """The units of the `count` disks (on different hosts) holding the most data, fullest first."""
    async with ClusterClient(cm_urls) as cm, BlobnodeClient() as bn:
        volumes = await cm.list_volumes()
        held = [(v.vid, i, u) for v in volumes for i, u in enumerate(v.units)]
        used = await asyncio.gather(*(bn.chunk_stat(u.host, u.disk_id, u.vuid) for _, _, u in held))
    per_disk: Counter[int] = Counter()
    for (_, _, unit), stat in zip(held, used, strict=True):
        per_disk[unit.disk_id] += stat.live_bytes
    host = {u.disk_id: u.host for _, _, u in held}
    chosen: list[int] = []
    for disk, _ in per_disk.most_common():
        if len(chosen) < count and host[disk] not in {host[d] for d in chosen}:
            chosen.append(disk)
    return [[h for h in held if h[2].disk_id == disk] for disk in chosen]


def rebuild_disk(cm_urls: list[str], units: Held, cap: float | None) -> dict[str, Any]:
    """In its own process: rebuild every unit of the disk onto new chunks at once, as a worker whose
    migrations write at most `cap` MiB/s together (None: no cap but the blobnodes')."""
    async def run() -> dict[str, Any]:
        config = WorkerConfig(clustermgr_hosts=cm_urls, migrate_mb_per_sec=cap)
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
        written = sum(p.done_bytes for p in done)
        return {"disk": units[0][2].disk_id, "units": len(units), "bytes": written,
                "shards": sum(p.done_shards for p in done), "rebuilt_shards": migrator.stats.rebuilt_shards,
                "seconds": round(elapsed, 2), "mb_per_s": round(written / elapsed / 1e6, 1), "worker_cap_mb": cap}

    return asyncio.run(run())


async def node_loss(info: launcher.ClusterInfo, broken_after: float) -> dict[str, Any]:
    """Kill -9 the blobnode with the most units and time the unattended repair of its disks."""
    async with ClusterClient(info.clustermgr_urls) as cm:
        await cm.set_config(BROKEN_AFTER_KEY, str(broken_after))
        volumes = await cm.list_volumes()
        units = Counter(u.host for v in volumes for u in v.units)
        victim = next(p for p in info.processes if p.role == "blobnode" and p.url == units.most_common(1)[0][0])
        disks = {d.disk_id for d in await cm.list_disks() if d.host == victim.url}
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        detected = repaired = 0.0
        while not repaired:
            statuses = {(await cm.get_disk(d)).status for d in disks}
            now = time.monotonic()
            if not detected and DiskStatus.NORMAL not in statuses:
                detected = now
            if statuses == {DiskStatus.REPAIRED}:
                repaired = now
            await asyncio.sleep(0.2)
        records = [TaskRecord.model_validate_json(raw) for raw in (await cm.kv_list(TASK_PREFIX)).values()]
    moved = [t for t in records if t.disk_id in disks and t.task_type is TaskType.DISK_REPAIR]
    written = sum(t.done_bytes for t in moved)
    return {"blobnode": victim.name, "disks": sorted(disks), "units": len(moved), "bytes": written,
            "broken_after_s": broken_after, "detect_s": round(detected - killed, 2),
            "repair_s": round(repaired - detected, 2), "time_to_redundancy_s": round(repaired - killed, 2),
            "mb_per_s": round(written / max(repaired - detected, 1e-9) / 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blobnodes", type=int, default=7)
    parser.add_argument("--fill-mb", type=int, default=600)
    parser.add_argument("--fill-size", type=int, default=MiB)
    parser.add_argument("--raw-mb", type=int, default=256)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--baseline", type=float, default=10.0)
    parser.add_argument("--load", type=float, default=0.33, help="user load as a share of the measured capacity")
    parser.add_argument("--worker-cap", type=float, default=8.0, help="migrate_mb_per_sec of the capped run")
    parser.add_argument("--broken-after", type=float, default=5.0, help="disk_broken_after of the node-loss run")
    parser.add_argument("--node-loss-only", action="store_true")
    parser.add_argument("--out", default="bench/results/repair.json")
    args = parser.parse_args()
    if args.node_loss_only:
        only_node_loss(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(blobnodes=args.blobnodes))
        try:
            stored = asyncio.run(fill(info.access_urls, args.fill_mb * MiB, args.fill_size))
            raw = raw_write(root, args.raw_mb * MiB)
            disks = asyncio.run(fullest_disks(info.clustermgr_urls, 3))
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                alone = pool.submit(rebuild_disk, info.clustermgr_urls, disks[0], None).result()
                closed, _ = asyncio.run(stream(info.access_urls, args.clients, args.size, 4.0, 0.0, lambda: None))
                rate = args.load * sum(o.kind == "put" for o in closed) / 4.0
                baseline = asyncio.run(paced_load(info.access_urls, rate, args.size,
                                                  partial(until, time.monotonic() + args.baseline)))
                runs = []
                for units, cap in ((disks[1], None), (disks[2], args.worker_cap)):
                    rebuild = pool.submit(rebuild_disk, info.clustermgr_urls, units, cap)
                    during = asyncio.run(paced_load(info.access_urls, rate, args.size, partial(running, rebuild)))
                    runs.append((rebuild.result(), during))
                baseline += asyncio.run(paced_load(info.access_urls, rate, args.size,
                                                   partial(until, time.monotonic() + args.baseline)))
                loaded = [under_load(rebuilt, baseline, during) for rebuilt, during in runs]
            lost = asyncio.run(node_loss(info, args.broken_after))
        finally:
            launcher.down(root)
    result = {
        "shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, EC3P3, background cap 64 MiB/s x 4 per disk",
        "stored_objects": stored, "object_size": args.fill_size, "raw_write": raw, "alone": alone,
        "rebuild_over_raw": round(alone["mb_per_s"] / raw["mb_per_s"], 2),
        "user_size": args.size, "user_capacity_pairs_per_s": round(rate / args.load, 1),
        "user_load_pairs_per_s": round(rate, 1), "under_load_uncapped": loaded[0],
        f"under_load_worker_cap_{args.worker_cap:g}_mb": loaded[1], "node_loss": lost,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))

    def effect(run: dict[str, Any]) -> str:
        ratio, user = run["p99_during_over_baseline"], run["user"]
        return (f"{run['mb_per_s']:.1f} MB/s, user p99 PUT {ratio['put']:.2f}x ({user['put']['baseline']['p99_ms']:.0f}"
                f" -> {user['put']['during']['p99_ms']:.0f} ms) GET {ratio['get']:.2f}x, p50 PUT "
                f"{run['p50_during_over_baseline']['put']:.2f}x GET {run['p50_during_over_baseline']['get']:.2f}x")

    print(f"repair: one disk ({alone['units']} units, {alone['shards']} shards, {alone['bytes'] / 1e6:.0f} MB) "
          f"rebuilt at {alone['mb_per_s']:.1f} MB/s vs raw durable write {raw['mb_per_s']:.1f} MB/s "
          f"= {result['rebuild_over_raw']:.2f}x (goal >= 0.5); under user load ({rate:.0f} PUT+GET/s of "
          f"{args.size >> 10} KiB, {args.load:.0%} of capacity): {effect(loaded[0])}; with the worker capped at "
          f"{args.worker_cap:g} MiB/s: {effect(loaded[1])} (goal <= 1.5x); {_node_loss_line(lost, raw)}")


def only_node_loss(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(blobnodes=args.blobnodes))
        try:
            stored = asyncio.run(fill(info.access_urls, args.fill_mb * MiB, args.fill_size))
            raw = raw_write(root, args.raw_mb * MiB)
            lost = asyncio.run(node_loss(info, args.broken_after))
        finally:
            launcher.down(root)
    result = {"shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, EC3P3, one worker",
              "stored_objects": stored, "object_size": args.fill_size, "raw_write": raw, "node_loss": lost,
              "rebuild_over_raw": round(lost["mb_per_s"] / raw["mb_per_s"], 2)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(_node_loss_line(lost, raw))


def _node_loss_line(lost: dict[str, Any], raw: dict[str, float]) -> str:
    return (f"node loss: {lost['blobnode']} killed ({len(lost['disks'])} disks, {lost['units']} units, "
            f"{lost['bytes'] / 1e6:.0f} MB): full redundancy after {lost['time_to_redundancy_s']:.1f} s "
            f"({lost['detect_s']:.1f} s to notice with disk_broken_after {lost['broken_after_s']:g} s, "
            f"{lost['repair_s']:.1f} s to rebuild at {lost['mb_per_s']:.1f} MB/s = "
            f"{lost['mb_per_s'] / raw['mb_per_s']:.2f}x raw durable write)")


def running(job: Future[Any]) -> bool:
    return not job.done()


def until(deadline: float) -> bool:
    return time.monotonic() < deadline


def under_load(rebuilt: dict[str, Any], baseline: list[Op], during: list[Op]) -> dict[str, Any]:
    user = {k: {"baseline": phase(baseline, k, -1e9, 1e9), "during": phase(during, k, -1e9, 1e9)}
            for k in ("put", "get")}
    ratios = {k: round(user[k]["during"]["p99_ms"] / user[k]["baseline"]["p99_ms"], 2) for k in user}
    medians = {k: round(user[k]["during"]["p50_ms"] / user[k]["baseline"]["p50_ms"], 2) for k in user}
    return {**rebuilt, "user": user, "p99_during_over_baseline": ratios, "p50_during_over_baseline": medians}


if __name__ == "__main__":
    main()
