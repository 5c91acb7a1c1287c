"""Small GETs' tail with and without the tail hedge (services/access/tail.py), side by side in one cluster.

Brings the default cluster up with the launcher and restarts access2 with `tail_hedge_quantile` 0 (hedge only
after `hedge_after`), so both access nodes read the same objects from the same blobnodes at the same moments.
`--objects` objects of `--size` bytes are written, read through both nodes until the tail is known, then for
each scenario an open loop of `--rate` GETs a second alternates between access1 (tail hedge on) and access2
(off) for `--seconds`: with no disturbance, and with one blobnode stopped (SIGSTOP) for 10 ms and for 30 ms
every 300 ms (the node holding data shard 0 of the first object, whose volume most objects share), as a node
stalls in a long GC pause, a compaction or a slow disk. Reports p50/p99/p99.9 of each
side, the hedges access1 made, and `p99_ratio` (on / off) per scenario. Writes JSON and prints one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blobstore_server.cluster import launcher
from blobstore_server.cluster.launcher import ClusterInfo
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.libs.proto.location import Location
from blobstore_server.services.clustermgr.client import ClusterClient

HEDGES = "blobstore_access_tail_hedged_reads_total"
SCENARIOS = {"none": 0.0, "stall 10 ms / 300 ms": 0.010, "stall 30 ms / 300 ms": 0.030}


def quantiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {name: round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e3, 2)
            for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999))} | {"count": len(ordered)}


class Staller:
    """Stops process `pid` for `pause` seconds every 300 ms from a thread, until `stop`; leaves it running."""

    def __init__(self, pid: int, pause: float) -> None:
        self.pid, self.pause, self._done = pid, pause, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(0.3):
            os.kill(self.pid, signal.SIGSTOP)
            try:
                time.sleep(self.pause)
            finally:
                os.kill(self.pid, signal.SIGCONT)

    def __enter__(self) -> Staller:
        if self.pause:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self.pause:
            self._thread.join()
        os.kill(self.pid, signal.SIGCONT)


async def hedges(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith(HEDGES + " "):
                return float(line.split()[1])
    return 0.0


async def data_node(info: ClusterInfo, key: bytes, token: str) -> int:
    """The pid of the blobnode holding data shard 0 of the object's first blob: the one to stall."""
    vid, _ = next(Location.from_token(token, key).blob_ids())
    async with ClusterClient(info.clustermgr_urls) as cm:
        host = (await cm.get_volume(vid)).units[0].host
    return next(p.pid for p in info.processes if p.url == host)


async def measure(info: ClusterInfo, urls: tuple[str, str], key: bytes, args: argparse.Namespace
                  ) -> dict[str, object]:
    data = [random.Random(k).randbytes(args.size) for k in range(args.objects)]
    results: dict[str, object] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        tokens = []
        for blob in data:
            async with session.put(f"{urls[0]}/blob", data=blob) as resp:
                assert resp.status == 200, await resp.text()
                tokens.append((await resp.json())["location"])
        stalled = await data_node(info, key, tokens[0])  # most objects share its volume: access reserves in bulk

        async def get(url: str, k: int, into: list[float]) -> None:
            started = time.perf_counter()
            async with session.get(f"{url}/blob/{tokens[k]}") as resp:
                assert resp.status == 200 and await resp.read() == data[k]
            into.append(time.perf_counter() - started)

        for _ in range(4):  # the tail is known after 64 reads of access1's
            for url in urls:
                await asyncio.gather(*(get(url, k, []) for k in range(len(tokens))))
        for scenario, pause in SCENARIOS.items():
            sides: tuple[list[float], list[float]] = ([], [])
            before = await hedges(session, urls[0])
            with Staller(stalled, pause):
                tasks, started, n = [], time.perf_counter(), 0
                while time.perf_counter() - started < args.seconds:
                    tasks.append(asyncio.create_task(get(urls[n % 2], random.randrange(len(tokens)), sides[n % 2])))
                    n += 1
                    await asyncio.sleep(max(0.0, started + n / args.rate - time.perf_counter()))
                await asyncio.gather(*tasks)
            on, off = quantiles(sides[0]), quantiles(sides[1])
            results[scenario] = {"tail_hedge_on": on, "tail_hedge_off": off,
                                 "hedged_reads": await hedges(session, urls[0]) - before,
                                 "p99_ratio": round(on["p99_ms"] / off["p99_ms"], 2)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=50)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="bench/results/tail.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tail-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(chunk_size=8 << 30))
        try:
            access2 = next(p for p in info.processes if p.name == "access2")
            config = json.loads(Path(access2.config).read_text())
            Path(access2.config).write_text(json.dumps({**config, "tail_hedge_quantile": 0}))
            os.kill(access2.pid, signal.SIGTERM)
            while access2.running:
                time.sleep(0.05)
            [second] = launcher.restart(root, "access2")
            key = json.loads(next(Path(p.config).read_text() for p in info.processes if p.name == "access1"))["secret"]
            results = asyncio.run(measure(info, (info.access_urls[0], second.url), key.encode(), args))
        finally:
            launcher.down(root)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    line = "; ".join(f"{name}: p99 {row['tail_hedge_on']['p99_ms']} vs {row['tail_hedge_off']['p99_ms']} ms "  # type: ignore[index]
                     f"({row['p99_ratio']}x, {row['hedged_reads']:.0f} hedged)"  # type: ignore[index]
                     for name, row in results.items())
    print(f"small GETs with / without the tail hedge, {args.size >> 10} KiB at {args.rate:.0f}/s: {line}")


if __name__ == "__main__":
    main()
