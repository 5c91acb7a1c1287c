"""What observability costs on the PUT path: small-object PUT ops/s through access with metrics and the
audit log on, with metrics on but no audit log, and with both off, in the same run; and, free of the
box's noise, the time the request instrumentation adds to one request (a bare ASGI request handled
in-process with and without `Instrumented`, also in this run).

Brings up one launcher cluster per variant (3 clustermgr, 6 blobnodes x 2 disks, two allocators, two access
nodes, EC3P3, fsync on) in a temp dir: "off" runs every process with BLOBSTORE_METRICS=off and access without
an audit log. The PUTs go through each cluster's access1 alone (what one access node does per second). The
dashboards are stopped first (scraping is not on the PUT path). Then `--rounds` rounds each PUT
`--count` objects of `--size` bytes at concurrency 8 into every variant, the order rotating per round so
drift on this shared 2-core box spreads over all variants; the ratio reported is the median over the
rounds of each round's ops/s against that round's "off". Writes JSON and prints one summary line.
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
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import drive, summarize
from blobstore_server.cluster import launcher
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.cluster.procs import stop
from blobstore_server.libs.rpc.asgi import Message, Receive, Scope, Send
from blobstore_server.libs.rpc.metrics import Instrumented

VARIANTS = {"metrics+audit": (True, True), "metrics": (True, False), "off": (False, False)}
CONCURRENCY = 8


def start(root: Path, metrics: bool, audit: bool) -> launcher.ClusterInfo:
    """A cluster whose processes inherit BLOBSTORE_METRICS from this one's environment as `up` runs."""
    os.environ["BLOBSTORE_METRICS"] = "on" if metrics else "off"
    try:
        info = launcher.up(root, ClusterShape(chunk_size=8 << 30, audit_log=audit))
    finally:
        os.environ.pop("BLOBSTORE_METRICS")
    dashboards = [p for p in info.processes if p.role == "dashboard"]
    stop([(p.pid, p.started) for p in dashboards])
    for url in info.access_urls:
        requests_measured = "blobstore_http_requests_total{" in httpx.get(f"{url}/metrics").text
        if requests_measured != metrics:
            raise RuntimeError(f"access {url} in {root} measures requests: {requests_measured}, expected {metrics}")
    return info


async def put_round(url: str, count: int, size: int) -> tuple[list[float], float]:
    data = os.urandom(size)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def put(_: int) -> None:
            async with session.put(f"{url}/blob", data=data) as resp:
                assert resp.status == 200, await resp.text()

        await drive(CONCURRENCY, CONCURRENCY, put)  # warm the connections
        return await drive(count, CONCURRENCY, put)


async def request_overhead_us(requests: int = 50_000) -> float:
    """Microseconds `Instrumented` adds to one request of a bare ASGI app (median of 5 runs each)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"x" * 100, "more_body": False}

    async def send(_: Message) -> None:
        return None

    async def per_request(handler: object) -> float:
        scope = {"type": "http", "method": "PUT", "path": "/shard/put", "client": ("127.0.0.1", 1)}
        call = handler  # an ASGI callable
        started = time.perf_counter()
        for _ in range(requests):
            await call(scope, receive, send)  # type: ignore[operator]
        return (time.perf_counter() - started) / requests * 1e6

    plain = statistics.median([await per_request(app) for _ in range(5)])
    measured = statistics.median([await per_request(Instrumented(app, "/shard/put")) for _ in range(5)])
    return round(measured - plain, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=10 << 10)
    parser.add_argument("--count", type=int, default=1000, help="PUTs per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/metrics_cost.json")
    args = parser.parse_args()
    latencies: dict[str, list[float]] = {name: [] for name in VARIANTS}
    elapsed = dict.fromkeys(VARIANTS, 0.0)
    per_round: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        clusters: dict[str, launcher.ClusterInfo] = {}
        try:
            for name, (metrics, audit) in VARIANTS.items():
                clusters[name] = start(Path(tmp) / name.replace("+", "-"), metrics, audit)
            names = list(VARIANTS)
            for round_no in range(args.rounds):
                for name in names[round_no % len(names):] + names[:round_no % len(names)]:
                    # one access node, deliberately (access_url is access1): the cost per request on one node
                    got, took = asyncio.run(put_round(clusters[name].access_url, args.count, args.size))
                    latencies[name] += got
                    elapsed[name] += took
                    per_round[name].append(round(len(got) / took, 1))
        finally:
            for info in clusters.values():
                launcher.down(Path(info.dir))
    results = {name: summarize(latencies[name], elapsed[name], args.size) for name in VARIANTS}
    ratios = {name: round(statistics.median(ops / off for ops, off in zip(per_round[name], per_round["off"],
                                                                         strict=True)), 3) for name in VARIANTS}
    overhead = asyncio.run(request_overhead_us())
    report = {"size": args.size, "count_per_round": args.count, "rounds": args.rounds, "concurrency": CONCURRENCY,
              "variants": results, "ops_per_s_by_round": per_round, "median_round_ratio_to_off": ratios,
              "instrumentation_us_per_request": overhead}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    line = "; ".join(f"{name} {r['ops_per_s']:.0f}/s p50 {r['p50_ms']:.1f} ms (x{ratios[name]:.3f})"
                     for name, r in results.items())
    print(f"metrics cost, {args.size >> 10} KiB EC3P3 PUT c={CONCURRENCY}: {line}; "
          f"instrumentation {overhead} us per request")


if __name__ == "__main__":
    main()
