"""Rebuild of a lost disk against the physical limit of this machine, and what it does to user latency.

For each code mode (`--modes`, default EC3P3 and EC6P3) a cluster comes up with the launcher (3 clustermgr,
`--blobnodes` x 2 disks, auth on, its scheduler and worker as configured by default), then:
1. fill: `--fill-mb` of `--fill-size` objects through both access nodes (stored_bytes: user bytes);
2. raw: `--raw-mb` of 1 MiB pwrite + fdatasync, 4 threads, into a file beside the cluster's disks: the
   disk bandwidth of this box (every blobnode disk is a folder of the same filesystem);
3. limit: a rebuilt byte of RS(N, M) costs N bytes read and one written, so one machine rebuilds at most
   raw / (N + 1) bytes per second;
4. capacity: `--clients` closed loops of PUT + GET of `--size` bytes for 4 s; the user load is then an open
   loop at `--load` of that rate, its p99 measured for `--baseline` seconds before and after the rebuild;
5. rebuild: the disk holding the most data is marked broken, as a failed disk is, and the scheduler and
   worker rebuild every unit of it from the other units while the user load runs. rebuild_mb_s: bytes the
   tasks rebuilt over the time from broken to repaired.
Before step 4, the same is done once with no user load (idle_rebuild_mb_s, idle_ratio): the blobnodes' background
rate yields to user requests (services/blobnode/iolimit.py), so the two differ by design.
Reports ratio = rebuild_mb_s / limit_mb_s (goal >= 0.5) and user p99 during over baseline (goal <= 1.5).
Writes JSON (bench/results/repair.json), prints one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.availability import Op, phase, stream
from bench.common import cpu_seconds, summarize
from blobstore_server.cluster import launcher
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.libs.ec import CodeMode, parse_code_mode, tactic
from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.scheduler import TASK_PREFIX, TaskRecord
from blobstore_server.libs.proto.switches import OFF, TaskType, switch_key
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient

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


async def fullest_disk(cm: ClusterClient) -> tuple[int, int]:
    """(disk id, live bytes) of the disk holding the most data."""
    async with BlobnodeClient() as bn:
        held = [u for v in await cm.list_volumes() for u in v.units]
        used = await asyncio.gather(*(bn.chunk_stat(u.host, u.disk_id, u.vuid) for u in held))
    per_disk: Counter[int] = Counter()
    for unit, stat in zip(held, used, strict=True):
        per_disk[unit.disk_id] += stat.live_bytes
    return per_disk.most_common(1)[0]


async def rebuild_under_load(info: launcher.ClusterInfo, rate: float, size: int) -> tuple[dict[str, Any], list[Op]]:
    """Mark the fullest disk broken and time its repair by the scheduler and worker, under the user load (none
    at rate 0)."""
    async with ClusterClient(info.clustermgr_urls) as cm:
        await cm.set_config(switch_key(TaskType.BALANCE), OFF)  # only the repair moves units
        disk, live = await fullest_disk(cm)
        repaired = False

        async def watch() -> float:
            nonlocal repaired
            start = time.monotonic()
            await cm.set_disk(disk, status=DiskStatus.BROKEN)
            while (await cm.get_disk(disk)).status is not DiskStatus.REPAIRED:
                await asyncio.sleep(0.2)
            repaired = True
            return time.monotonic() - start

        cpu_before = cpu_by_role(info)
        if rate > 0:
            seconds, during = await asyncio.gather(watch(), paced_load(info.access_urls, rate, size,
                                                                       lambda: not repaired))
        else:
            seconds, during = await watch(), []
        cpu = {role: round(spent - cpu_before.get(role, 0.0), 1) for role, spent in cpu_by_role(info).items()}
        records = [TaskRecord.model_validate_json(raw) for raw in (await cm.kv_list(TASK_PREFIX)).values()]
    moved = [t for t in records if t.disk_id == disk and t.task_type is TaskType.DISK_REPAIR]
    rebuilt = sum(t.done_bytes for t in moved)
    return {"disk": disk, "live_bytes": live, "units": len(moved), "bytes": rebuilt, "seconds": round(seconds, 2),
            "rebuild_mb_s": round(rebuilt / seconds / 1e6, 1), "cpu_s_by_role": cpu}, during


def cpu_by_role(info: launcher.ClusterInfo) -> dict[str, float]:
    """CPU seconds each role's processes have spent so far (the profile of where a rebuild's CPU goes); a
    blobnode's background reader, its child, is a role of its own. The bench counts itself only: the cluster's
    processes are its children too."""
    spent: dict[str, float] = {"bench": time.process_time()}
    for process in info.processes:
        own = cpu_seconds(process.pid, children=False)
        spent[process.role] = spent.get(process.role, 0.0) + own
        if process.role == "blobnode":
            spent["background reader"] = spent.get("background reader", 0.0) + cpu_seconds(process.pid) - own
    return spent


def one_mode(mode: CodeMode, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(blobnodes=args.blobnodes, code_mode=mode))
        try:
            stored = asyncio.run(fill(info.access_urls, args.fill_mb * MiB, args.fill_size))
            raw = raw_write(root, args.raw_mb * MiB)
            idle, _ = asyncio.run(rebuild_under_load(info, 0.0, args.size))
            closed, _ = asyncio.run(stream(info.access_urls, args.clients, args.size, 4.0, 0.0, lambda: None))
            rate = args.load * sum(o.kind == "put" for o in closed) / 4.0
            baseline = asyncio.run(paced_load(info.access_urls, rate, args.size,
                                              partial(until, time.monotonic() + args.baseline)))
            rebuild, during = asyncio.run(rebuild_under_load(info, rate, args.size))
            baseline += asyncio.run(paced_load(info.access_urls, rate, args.size,
                                               partial(until, time.monotonic() + args.baseline)))
        finally:
            launcher.down(root)
    limit = raw["mb_per_s"] / (tactic(mode).n + 1)
    run = under_load({"code_mode": mode.name, "stored_bytes": stored * args.fill_size, "raw_write": raw, **rebuild,
                      "limit_mb_s": round(limit, 1), "ratio": round(rebuild["rebuild_mb_s"] / limit, 2),
                      "user_load_pairs_per_s": round(rate, 1), "idle": idle,
                      "idle_rebuild_mb_s": idle["rebuild_mb_s"], "idle_ratio": round(idle["rebuild_mb_s"] / limit, 2)},
                     baseline, during)
    ratios = run["p99_during_over_baseline"]
    return {**run, "p99_ratio_put": ratios["put"], "p99_ratio_get": ratios["get"]}


def until(deadline: float) -> bool:
    return time.monotonic() < deadline


def under_load(figures: dict[str, Any], baseline: list[Op], during: list[Op]) -> dict[str, Any]:
    """`figures` with the user's latency before and during some background work, and their ratios."""
    user = {k: {"baseline": phase(baseline, k, -1e9, 1e9), "during": phase(during, k, -1e9, 1e9)}
            for k in ("put", "get")}
    ratios = {k: round(user[k]["during"]["p99_ms"] / user[k]["baseline"]["p99_ms"], 2) for k in user}
    medians = {k: round(user[k]["during"]["p50_ms"] / user[k]["baseline"]["p50_ms"], 2) for k in user}
    return {**figures, "user": user, "p99_during_over_baseline": ratios, "p50_during_over_baseline": medians}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="EC3P3,EC6P3")
    parser.add_argument("--blobnodes", type=int, default=8)
    parser.add_argument("--fill-mb", type=int, default=4200)
    parser.add_argument("--fill-size", type=int, default=4 * MiB)
    parser.add_argument("--raw-mb", type=int, default=512)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--baseline", type=float, default=10.0)
    parser.add_argument("--load", type=float, default=0.33, help="user load as a share of the measured capacity")
    parser.add_argument("--out", default="bench/results/repair.json")
    args = parser.parse_args()
    runs = [one_mode(parse_code_mode(mode), args) for mode in args.modes.split(",")]
    worst = min(runs, key=lambda r: r["ratio"])
    result = {"shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, auth on, default worker",
              "runs": runs, **{k: worst[k] for k in ("rebuild_mb_s", "limit_mb_s", "ratio", "stored_bytes")},
              **{k: min(r[k] for r in runs) for k in ("idle_rebuild_mb_s", "idle_ratio")},
              "p99_ratio_put": max(r["p99_ratio_put"] for r in runs),
              "p99_ratio_get": max(r["p99_ratio_get"] for r in runs)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print("repair: " + "; ".join(
        f"{r['code_mode']} {r['stored_bytes'] / 2**30:.1f} GiB stored, disk {r['disk']} ({r['bytes'] / 1e6:.0f} MB) "
        f"rebuilt at {r['rebuild_mb_s']:.1f} MB/s vs limit {r['limit_mb_s']:.1f} (raw {r['raw_write']['mb_per_s']:.0f}"
        f" / {tactic(CodeMode[r['code_mode']]).n + 1}) = {r['ratio']:.2f}x (goal >= 0.5), user p99 PUT "
        f"{r['p99_ratio_put']:.2f}x"
        f" GET {r['p99_ratio_get']:.2f}x (goal <= 1.5); with no user load disk {r['idle']['disk']}"
        f" ({r['idle']['bytes'] / 1e6:.0f} MB) at {r['idle_rebuild_mb_s']:.1f} MB/s = {r['idle_ratio']:.2f}x"
        for r in runs))


if __name__ == "__main__":
    main()
