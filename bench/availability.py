"""PUT/GET availability when a blobnode dies, measured as a user sees it.

Brings a cluster up with the launcher (`make demo`'s shape: 3 clustermgr, 6 blobnodes x 2 disks, two
allocators, two access nodes, EC3P3; `--blobnodes 8 --kill 2` for the issue's second case), runs a steady
stream of `--clients` concurrent loops, spread over the access nodes (loop i talks to access node i mod n),
each doing a PUT of `--size` random bytes and a GET of an earlier acknowledged object, for `--before`
seconds; then kill -9 the `--kill` blobnodes whose loss hurts writes most (they hold two or more units of
the most volumes) and keeps the stream going for `--after` seconds. The phase before the kill is the
same-run baseline.
Reports PUT and GET success rates and p50/p99 latency before the kill, in the first 10 s after it and from
then on, checks that every acknowledged object reads back byte for byte, writes JSON and prints one line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blobstore import launcher
from blobstore.plan import ClusterShape
from libs.proto.cluster import VolumeInfo
from services.clustermgr.client import ClusterClient

SETTLE = 10.0  # seconds after the kill that the issue allows the cluster to adapt


@dataclass(frozen=True)
class Op:
    kind: str  # "put" or "get"
    start: float  # seconds since the kill (negative: before it)
    latency: float
    ok: bool


def phase(ops: list[Op], kind: str, lo: float, hi: float) -> dict[str, float]:
    chosen = [o for o in ops if o.kind == kind and lo <= o.start < hi]
    if not chosen:
        return {"count": 0}
    latencies = sorted(o.latency for o in chosen)
    return {"count": len(chosen), "success_rate": round(sum(o.ok for o in chosen) / len(chosen), 5),
            "p50_ms": round(statistics.median(latencies) * 1e3, 1),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3, 1)}


def worst_victims(info: launcher.ClusterInfo, count: int) -> tuple[list[launcher.ProcessRecord], dict[str, int]]:
    """The `count` blobnodes whose loss hurts writes most: they hold two or more units of the most volumes
    (then the most units). Also how the volumes are spread, for the JSON."""
    async def volumes() -> list[VolumeInfo]:
        async with ClusterClient(info.clustermgr_urls) as cm:
            return list(await cm.list_volumes())

    listed = asyncio.run(volumes())
    nodes = [p for p in info.processes if p.role == "blobnode"]

    def harm(group: tuple[launcher.ProcessRecord, ...]) -> tuple[int, int, list[str]]:
        urls = {p.url for p in group}
        on_group = [sum(u.host in urls for u in v.units) for v in listed]
        return sum(n >= 2 for n in on_group), sum(on_group), [p.name for p in group]

    worst = max(itertools.combinations(nodes, count), key=harm)
    spread = {"volumes": len(listed),
              "volumes_with_two_units_on_one_host": sum(len({u.host for u in v.units}) < len(v.units) for v in listed),
              "volumes_losing_two_or_more_units": harm(worst)[0]}
    return list(worst), spread


async def stream(access: list[str], clients: int, size: int, before: float, after: float,
                 kill: Callable[[], None]) -> tuple[list[Op], dict[str, bytes]]:
    """Run the PUT/GET loops, loop i through access node i mod len(access) (a GET may read what another
    node stored); calls `kill()` after `before` seconds and stops `after` seconds later.
    Each op's start is given in seconds relative to the kill."""
    raw: list[tuple[str, float, float, bool]] = []
    acked: dict[str, bytes] = {}
    stop_at = time.monotonic() + before + after

    async def timed(kind: str, call: Callable[[], Awaitable[bool]]) -> bool:
        t0 = time.monotonic()
        try:
            ok = await call()
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        raw.append((kind, t0, time.monotonic() - t0, ok))
        return ok

    async def put(session: aiohttp.ClientSession, url: str, data: bytes) -> bool:
        async with session.put(f"{url}/blob", data=data) as resp:
            if resp.status != 200:
                return False
            acked[(await resp.json())["location"]] = data
            return True

    async def get(session: aiohttp.ClientSession, url: str, token: str) -> bool:
        async with session.get(f"{url}/blob/{token}") as resp:
            return resp.status == 200 and await resp.read() == acked[token]

    async def loop(session: aiohttp.ClientSession, seed: int) -> None:
        rng = random.Random(seed)
        url = access[seed % len(access)]
        while time.monotonic() < stop_at:
            await timed("put", partial(put, session, url, rng.randbytes(size)))
            if acked:
                await timed("get", partial(get, session, url, rng.choice(list(acked))))

    killed_at = 0.0

    async def killer() -> None:
        nonlocal killed_at
        await asyncio.sleep(before)
        killed_at = time.monotonic()
        kill()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(killer(), *(loop(session, s) for s in range(clients)))
    return [Op(kind, t0 - killed_at, latency, ok) for kind, t0, latency, ok in raw], acked


async def read_back(access: list[str], acked: dict[str, bytes]) -> int:
    """How many acknowledged objects do not read back byte for byte (read through the access nodes in turn)."""
    bad = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        sem = asyncio.Semaphore(8)

        async def one(url: str, token: str, data: bytes) -> None:
            nonlocal bad
            async with sem, session.get(f"{url}/blob/{token}") as resp:
                if resp.status != 200 or await resp.read() != data:
                    bad += 1

        await asyncio.gather(*(one(access[i % len(access)], t, d) for i, (t, d) in enumerate(acked.items())))
    return bad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--before", type=float, default=15.0)
    parser.add_argument("--after", type=float, default=40.0)
    parser.add_argument("--blobnodes", type=int, default=6)
    parser.add_argument("--kill", type=int, default=1, help="how many blobnodes to kill -9 at once")
    parser.add_argument("--out", default="bench/results/availability.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-avail-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(blobnodes=args.blobnodes))
        try:
            victims, spread = worst_victims(info, args.kill)

            def kill() -> None:
                for victim in victims:
                    os.kill(victim.pid, signal.SIGKILL)

            ops, acked = asyncio.run(stream(info.access_urls, args.clients, args.size, args.before, args.after,
                                            kill))
            unreadable = asyncio.run(read_back(info.access_urls, acked))
        finally:
            launcher.down(root)
    result = {
        "shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, EC3P3", "clients": args.clients,
        "size": args.size, "killed": [v.name for v in victims], **spread,
        "before_kill": {k: phase(ops, k, -args.before, 0.0) for k in ("put", "get")},
        "first_10s_after": {k: phase(ops, k, 0.0, SETTLE) for k in ("put", "get")},
        "after_10s": {k: phase(ops, k, SETTLE, args.after + 1) for k in ("put", "get")},
        "acked_puts": len(acked), "acked_not_readable": unreadable,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    b, f, a = (result[p]["put"] for p in ("before_kill", "first_10s_after", "after_10s"))
    print(f"availability (kill -9 {'+'.join(v.name for v in victims)} of {args.blobnodes}, {args.clients} clients, "
          f"{args.size >> 10} KiB PUT+GET; {spread['volumes_losing_two_or_more_units']} of {spread['volumes']}"
          f" volumes lose 2+ units): "
          f"PUT ok {b['success_rate']:.2%} p99 {b['p99_ms']:.0f} ms before; "
          f"{f['success_rate']:.2%} p99 {f['p99_ms']:.0f} ms in the first 10 s; "
          f"{a['success_rate']:.2%} p99 {a['p99_ms']:.0f} ms after; "
          f"{len(acked)} acked, {unreadable} unreadable")


if __name__ == "__main__":
    main()
