"""Rebuild of a lost disk against the physical limit of this machine, its CPU per byte, and what it leaves users.

For each code mode (`--modes`, default EC3P3 and EC6P3) a cluster comes up with the launcher (3 clustermgr,
`--blobnodes` x 2 disks, auth on, its scheduler and worker as configured by default), then:
1. fill: `--fill-mb` of `--fill-size` objects through both access nodes (stored_bytes: user bytes);
2. raw: `--raw-mb` of 1 MiB pwrite + fdatasync, 4 threads, into a file beside the cluster's disks: the
   disk bandwidth of this box (every blobnode disk is a folder of the same filesystem);
3. limit: a rebuilt byte of RS(N, M) costs N bytes read and one written, so one machine rebuilds at most
   raw / (N + 1) bytes per second;
4. baseline: `--clients` closed loops of PUT + GET of `--size` bytes for `--baseline` seconds: what users get of
   this box (their throughput, p50, p99);
5. rebuild: the disk holding the most data is marked broken, as a failed disk is, and the scheduler and
   worker rebuild every unit of it from the other units while the same loops run. rebuild_mb_s: bytes the
   tasks rebuilt over the time from broken to repaired.
Before step 4, the same is done once with no user load (idle_rebuild_mb_s, idle_ratio): the blobnodes' background
rate yields to user requests (services/blobnode/iolimit.py), so the two differ by design.
Reports idle_ratio and ratio = rebuild_mb_s / limit_mb_s (goals >= 0.5 idle, >= 0.25 under load), the user's
throughput during over baseline (goal >= 0.8), user p99 during over baseline, and cpu_ms_per_mb: the CPU every process
of the cluster spent over the rebuilt MB (goal <= 4), idle and under load (there, less what the same user operations
cost in the baseline). `--idle-only` stops after the idle rebuild (a profile's run).
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
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.availability import Op, drive, phase, pinned
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


async def fullest_disk(cm: ClusterClient) -> tuple[int, int]:
    """(disk id, live bytes) of the disk holding the most data."""
    async with BlobnodeClient() as bn:
        held = [u for v in await cm.list_volumes() for u in v.units]
        used = await asyncio.gather(*(bn.chunk_stat(u.host, u.disk_id, u.vuid) for u in held))
    per_disk: Counter[int] = Counter()
    for unit, stat in zip(held, used, strict=True):
        per_disk[unit.disk_id] += stat.live_bytes
    return per_disk.most_common(1)[0]


async def rebuild_under_load(info: launcher.ClusterInfo, clients: int, size: int, user_op_cpu: float = 0.0
                             ) -> tuple[dict[str, Any], list[Op]]:
    """Mark the fullest disk broken and time its repair by the scheduler and worker, while `clients` user loops
    run (none: an idle rebuild); their operations. cpu_ms_per_mb: the cluster's CPU over the rebuilt MB, less
    `user_op_cpu` seconds per user operation (what the same load cost without a rebuild)."""
    async with ClusterClient(info.clustermgr_urls) as cm:
        await cm.set_config(switch_key(TaskType.BALANCE), OFF)  # only the repair moves units
        disk, live = await fullest_disk(cm)
        took: list[float] = []

        async def repair() -> float:
            start = time.monotonic()
            await cm.set_disk(disk, status=DiskStatus.BROKEN)
            while (await cm.get_disk(disk)).status is not DiskStatus.REPAIRED:
                await asyncio.sleep(0.2)
            took.append(time.monotonic() - start)
            return start

        cpu_before = cpu_by_role(info)
        during = (await drive(pinned(info.access_urls), clients, size, repair))[0] if clients else []
        if not clients:
            await repair()
        cpu = {role: round(spent - cpu_before.get(role, 0.0), 1) for role, spent in cpu_by_role(info).items()}
        records = [TaskRecord.model_validate_json(raw) for raw in (await cm.kv_list(TASK_PREFIX)).values()]
    moved = [t for t in records if t.disk_id == disk and t.task_type is TaskType.DISK_REPAIR]
    rebuilt = sum(t.done_bytes for t in moved)
    rebuild_cpu = cluster_cpu(cpu) - user_op_cpu * len(during)
    return {"disk": disk, "live_bytes": live, "units": len(moved), "bytes": rebuilt, "seconds": round(took[0], 2),
            "rebuild_mb_s": round(rebuilt / took[0] / 1e6, 1), "cpu_s_by_role": cpu,
            "cpu_ms_per_mb": round(rebuild_cpu * 1e3 / max(rebuilt / 1e6, 1e-9), 2)}, during


def cluster_cpu(by_role: dict[str, float]) -> float:
    """CPU seconds of every process of the cluster (the bench's own aside)."""
    return sum(spent for role, spent in by_role.items() if role != "bench")


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
            idle, _ = asyncio.run(rebuild_under_load(info, 0, args.size))
            if args.idle_only:
                return idle_figures(mode, stored * args.fill_size, raw, idle)
            before = cpu_by_role(info)
            baseline, _ = asyncio.run(drive(pinned(info.access_urls), args.clients, args.size,
                                            partial(waited, args.baseline)))
            spent = {role: cpu - before.get(role, 0.0) for role, cpu in cpu_by_role(info).items()}
            rebuild, during = asyncio.run(rebuild_under_load(info, args.clients, args.size,
                                                             cluster_cpu(spent) / max(len(baseline), 1)))
        finally:
            launcher.down(root)
    figures = idle_figures(mode, stored * args.fill_size, raw, idle)
    run = under_load({**figures, **rebuild, "ratio": round(rebuild["rebuild_mb_s"] / figures["limit_mb_s"], 2),
                      "user_throughput_during_over_baseline": round(ok_rate(during) / ok_rate(baseline), 2)},
                     baseline, during)
    ratios = run["p99_during_over_baseline"]
    return {**run, "p99_ratio_put": ratios["put"], "p99_ratio_get": ratios["get"]}


def idle_figures(mode: CodeMode, stored: int, raw: dict[str, float], idle: dict[str, Any]) -> dict[str, Any]:
    """What the rebuild with no user load measured, against the limit."""
    limit = raw["mb_per_s"] / (tactic(mode).n + 1)
    return {"code_mode": mode.name, "stored_bytes": stored, "raw_write": raw, "limit_mb_s": round(limit, 1),
            "idle": idle, "idle_rebuild_mb_s": idle["rebuild_mb_s"],
            "idle_ratio": round(idle["rebuild_mb_s"] / limit, 2), "idle_cpu_ms_per_mb": idle["cpu_ms_per_mb"]}


async def waited(seconds: float) -> float:
    """A scenario of nothing but `seconds` of user load."""
    start = time.monotonic()
    await asyncio.sleep(seconds)
    return start


def under_load(figures: dict[str, Any], baseline: list[Op], during: list[Op]) -> dict[str, Any]:
    """`figures` with the user's latency before and during some background work, and their ratios."""
    user = {k: {"baseline": phase(baseline, k, -1e9, 1e9), "during": phase(during, k, -1e9, 1e9)}
            for k in ("put", "get")}
    ratios = {k: round(user[k]["during"]["p99_ms"] / user[k]["baseline"]["p99_ms"], 2) for k in user}
    medians = {k: round(user[k]["during"]["p50_ms"] / user[k]["baseline"]["p50_ms"], 2) for k in user}
    return {**figures, "user": user, "p99_during_over_baseline": ratios, "p50_during_over_baseline": medians}


def ok_rate(ops: list[Op]) -> float:
    """Successful user operations per second over the span they ran."""
    if not ops:
        return 0.0
    span = max(o.start + o.latency for o in ops) - min(o.start for o in ops)
    return sum(o.ok for o in ops) / max(span, 1e-9)


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
    parser.add_argument("--idle-only", action="store_true", help="stop after the idle rebuild")
    parser.add_argument("--out", default="bench/results/repair.json")
    args = parser.parse_args()
    runs = [one_mode(parse_code_mode(mode), args) for mode in args.modes.split(",")]
    result: dict[str, Any] = {
        "shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, auth on, default worker", "runs": runs,
        # the rate the durability model takes (`blobstore durability`): a rebuild's where users leave room
        "rebuild_mb_s": min(r["idle_rebuild_mb_s"] for r in runs), "idle_ratio": min(r["idle_ratio"] for r in runs),
        "idle_cpu_ms_per_mb": max(r["idle_cpu_ms_per_mb"] for r in runs)}
    if not args.idle_only:
        result |= {"ratio": min(r["ratio"] for r in runs), "cpu_ms_per_mb": max(r["cpu_ms_per_mb"] for r in runs),
                   "user_throughput_during_over_baseline": min(r["user_throughput_during_over_baseline"]
                                                               for r in runs)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print("repair: " + "; ".join(summary(r) for r in runs))


def summary(run: dict[str, Any]) -> str:
    idle = run["idle"]
    line = (f"{run['code_mode']} {run['stored_bytes'] / 2**30:.1f} GiB stored, limit {run['limit_mb_s']:.1f} MB/s (raw "
            f"{run['raw_write']['mb_per_s']:.0f} / {tactic(CodeMode[run['code_mode']]).n + 1}); idle: disk "
            f"{idle['disk']} ({idle['bytes'] / 1e6:.0f} MB) at {idle['rebuild_mb_s']:.1f} MB/s = "
            f"{run['idle_ratio']:.2f}x (goal >= 0.5), {idle['cpu_ms_per_mb']:.1f} ms CPU/MB (goal <= 4)")
    if "ratio" not in run:
        return line
    return (line + f"; under {run['user']['put']['during']['count']} user PUTs: {run['rebuild_mb_s']:.1f} MB/s = "
            f"{run['ratio']:.2f}x (goal >= 0.25), {run['cpu_ms_per_mb']:.1f} ms CPU/MB, user throughput "
            f"{run['user_throughput_during_over_baseline']:.2f}x (goal >= 0.8), p99 PUT {run['p99_ratio_put']:.2f}x "
            f"GET {run['p99_ratio_get']:.2f}x")


if __name__ == "__main__":
    main()
