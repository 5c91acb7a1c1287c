"""The Python SDK next to a bare aiohttp client doing the same HTTP requests, on a whole local cluster.

Brings the default cluster up with the launcher (EC3P3, fsync on) in a temp dir and, through access1 alone, PUTs
then GETs 16 MiB objects with 2 clients and 10 KiB objects with 8, once with `blobstore.AsyncClient` (what a Python
application calls) and once with an aiohttp session sending the same requests and reading each answer whole: the
floor a Python client on asyncio could reach. The two alternate in rounds (A B A B A B) in this one process, so
the client CPU each spends is its own (`time.process_time` over its rounds). The figure that matters is the
SDK's client CPU per operation against aiohttp's; the cluster's share is the same for both. The SDK reads through
access here, as aiohttp does (its direct reads from the blobnodes are bench/access.py's "GET direct").
Writes JSON and prints one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import drive, summarize
from blobstore import AsyncClient
from blobstore_server.cluster import launcher
from blobstore_server.cluster.plan import ClusterShape

ROUNDS = 3


@dataclass(frozen=True)
class Workload:
    name: str
    size: int
    clients: int
    count: int  # objects each client kind writes, and reads back once per pass
    get_passes: int = 1


WORKLOADS = (Workload("16MiB", 16 << 20, 2, 24, get_passes=3), Workload("10KiB", 10 << 10, 8, 1200))

Op = Callable[[int], Awaitable[object]]


@dataclass
class Side:
    """One client kind's latencies, wall time and client CPU over its rounds."""

    latencies: list[float]
    elapsed: float = 0.0
    cpu: float = 0.0

    async def run(self, count: int, clients: int, op: Op) -> float:
        cpu = time.process_time()
        latencies, elapsed = await drive(count, clients, op)
        self.cpu += time.process_time() - cpu
        self.latencies += latencies
        self.elapsed += elapsed
        return len(latencies) / elapsed

    def report(self, size: int) -> dict[str, float]:
        return {**summarize(self.latencies, self.elapsed, size),
                "client_cpu_ms_per_op": round(self.cpu / len(self.latencies) * 1e3, 3)}


async def bench_workload(url: str, load: Workload) -> dict[str, dict[str, object]]:
    data = os.urandom(load.size)
    locations: dict[str, dict[int, str]] = {"sdk": {}, "aiohttp": {}}
    connector = aiohttp.TCPConnector(limit=load.clients)
    async with AsyncClient(url, timeout=600, direct_reads=False) as sdk, \
            aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def sdk_put(i: int) -> None:
            locations["sdk"][i] = await sdk.put(data)

        async def sdk_get(i: int) -> None:
            assert len(await sdk.get(locations["sdk"][i % load.count])) == load.size

        async def raw_put(i: int) -> None:
            async with session.put(f"{url}/blob", data=data,
                                   headers={"content-type": "application/octet-stream"}) as resp:
                assert resp.status == 200, await resp.text()
                locations["aiohttp"][i] = (await resp.json())["location"]

        async def raw_get(i: int) -> None:
            async with session.get(f"{url}/blob/{locations['aiohttp'][i % load.count]}") as resp:
                assert resp.status == 200
                assert len(await resp.read()) == load.size

        results: dict[str, dict[str, object]] = {}
        for name, ours, theirs, ops in (("put", sdk_put, raw_put, load.count),
                                        ("get", sdk_get, raw_get, load.count * load.get_passes)):
            sdk_side, raw_side, ratios = Side([]), Side([]), []
            for r in range(ROUNDS):
                first, last = r * ops // ROUNDS, (r + 1) * ops // ROUNDS

                def shifted(op: Op, start: int = first) -> Op:
                    return lambda i: op(start + i)

                rate = await sdk_side.run(last - first, load.clients, shifted(ours))
                ratios.append(rate / await raw_side.run(last - first, load.clients, shifted(theirs)))
            sdk_report, raw_report = sdk_side.report(load.size), raw_side.report(load.size)
            results[name] = {"rate_ratio": round(statistics.median(ratios), 3),
                             "cpu_ratio": round(sdk_report["client_cpu_ms_per_op"]
                                                / raw_report["client_cpu_ms_per_op"], 2),
                             "sdk": sdk_report, "aiohttp": raw_report}
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the object counts")
    parser.add_argument("--out", default="bench/results/sdk.json")
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sdk-") as tmp:
        info = launcher.up(Path(tmp) / "cluster", ClusterShape(chunk_size=8 << 30))
        try:
            for load in WORKLOADS:
                count = max(load.clients * ROUNDS, int(load.count * args.scale))
                measured = asyncio.run(bench_workload(info.access_url, Workload(**{**load.__dict__,
                                                                                    "count": count})))
                for op in ("put", "get"):
                    results[f"{load.name} {op.upper()} c={load.clients}"] = measured[op]
        finally:
            launcher.down(Path(tmp) / "cluster")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    line = "; ".join(f"{key} {row['sdk']['client_cpu_ms_per_op']:.2f} vs "  # type: ignore[index]
                     f"{row['aiohttp']['client_cpu_ms_per_op']:.2f} ms ({row['cpu_ratio']}x), "  # type: ignore[index]
                     f"{row['rate_ratio']}x the rate"
                     for key, row in results.items())
    print(f"SDK vs bare aiohttp, client CPU per op: {line}")


if __name__ == "__main__":
    main()
