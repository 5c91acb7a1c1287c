"""What TLS costs on the data path: the same cluster twice on 127.0.0.1, one plaintext and one with every HTTP
service and Raft on TLS (`ClusterShape(tls=True)`, a certificate for 127.0.0.1), both up at once.

Through the SDK (direct reads on, as applications run it), 10 KiB PUTs with 8 clients and 16 MiB GETs with 2
alternate between the two clusters in rounds (plain, TLS, plain, TLS, ...), so the box's noise hits both alike.
Reported per workload: each side's rate, the ratio TLS / plain (median of the rounds' ratios), and the CPU per
operation of the cluster's processes (all of them, summed) and of the client, each side's own. Writes JSON and
prints one summary line.
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
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_seconds, drive
from blobstore import AsyncClient
from blobstore_server.cluster import launcher
from blobstore_server.cluster.launcher import ClusterInfo
from blobstore_server.cluster.plan import ClusterShape

ROUNDS = 4


@dataclass(frozen=True)
class Workload:
    name: str
    size: int
    clients: int
    count: int  # operations per round


WORKLOADS = (Workload("10KiB PUT", 10 << 10, 8, 400), Workload("16MiB GET", 16 << 20, 2, 12))


@dataclass
class Side:
    """One cluster's rounds: operations, wall time, the cluster's CPU and the client's."""

    info: ClusterInfo
    ops: int = 0
    elapsed: float = 0.0
    cluster_cpu: float = 0.0
    client_cpu: float = 0.0
    rates: list[float] = field(default_factory=list)

    def cluster_seconds(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.info.processes)

    async def round(self, count: int, clients: int, op: Callable[[int], Awaitable[object]]) -> None:
        cluster, client = self.cluster_seconds(), time.process_time()
        latencies, elapsed = await drive(count, clients, op)
        self.client_cpu += time.process_time() - client
        self.cluster_cpu += self.cluster_seconds() - cluster
        self.ops += len(latencies)
        self.elapsed += elapsed
        self.rates.append(len(latencies) / elapsed)

    def report(self, size: int) -> dict[str, float]:
        return {"ops_per_s": round(self.ops / self.elapsed, 1),
                "mb_per_s": round(self.ops * size / self.elapsed / 1e6, 1),
                "cluster_cpu_ms_per_op": round(self.cluster_cpu / self.ops * 1e3, 3),
                "client_cpu_ms_per_op": round(self.client_cpu / self.ops * 1e3, 3)}


async def bench(plain: ClusterInfo, tls: ClusterInfo, load: Workload) -> dict[str, object]:
    data = os.urandom(load.size)
    sides = {"plain": Side(plain), "tls": Side(tls)}
    async with AsyncClient(plain.access_urls, timeout=600) as a, AsyncClient(tls.access_urls, timeout=600,
                                                                               ca=tls.ca) as b:
        clients = {"plain": a, "tls": b}
        reads = "GET" in load.name
        stored = {name: [await c.put(data) for _ in range(load.clients)] if reads else []
                  for name, c in clients.items()}
        for _ in range(ROUNDS):
            for name, side in sides.items():
                client, locations = clients[name], stored[name]

                async def op(i: int, client: AsyncClient = client, locations: list[str] = locations) -> None:
                    if reads:
                        assert len(await client.get(locations[i % len(locations)])) == load.size
                    else:
                        await client.put(data)

                await side.round(load.count, load.clients, op)
    ratios = [t / p for p, t in zip(sides["plain"].rates, sides["tls"].rates, strict=True)]
    plain_report, tls_report = sides["plain"].report(load.size), sides["tls"].report(load.size)
    return {"rate_ratio": round(statistics.median(ratios), 3),
            "cluster_cpu_ms_per_op_added": round(tls_report["cluster_cpu_ms_per_op"]
                                                 - plain_report["cluster_cpu_ms_per_op"], 3),
            "plain": plain_report, "tls": tls_report}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the operations per round")
    parser.add_argument("--out", default="bench/results/tls.json")
    args = parser.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        roots = {name: Path(tmp) / name for name in ("plain", "tls")}
        started: dict[str, ClusterInfo] = {}
        try:
            for name, root in roots.items():
                started[name] = launcher.up(root, ClusterShape(chunk_size=8 << 30, tls=name == "tls"))
            for load in WORKLOADS:
                scaled = Workload(load.name, load.size, load.clients, max(load.clients, int(load.count * args.scale)))
                results[load.name] = asyncio.run(bench(started["plain"], started["tls"], scaled))
        finally:
            for name in started:
                launcher.down(roots[name])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    line = "; ".join(f"{name}: {row['rate_ratio']}x the plaintext rate, "  # type: ignore[index]
                     f"+{row['cluster_cpu_ms_per_op_added']} ms cluster CPU per op "  # type: ignore[index]
                     f"({row['plain']['cluster_cpu_ms_per_op']} -> {row['tls']['cluster_cpu_ms_per_op']})"  # type: ignore[index]
                     for name, row in results.items())
    print(f"TLS vs plaintext, same run: {line}")


if __name__ == "__main__":
    main()
