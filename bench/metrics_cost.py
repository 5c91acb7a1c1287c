"""What observability costs on the PUT path: small-object PUT ops/s through access with metrics and the
audit log on, with metrics on but no audit log, and with both off, in the same run.

Brings up one launcher cluster per variant (3 clustermgr, 6 blobnodes x 2 disks, EC3P3, fsync on) in a
temp dir: "off" runs every process with BLOBSTORE_METRICS=off and access without an audit log. The
dashboards are stopped first (scraping is not on the PUT path). Then `--rounds` rounds each PUT
`--count` objects of `--size` bytes at concurrency 8 into every variant, the order rotating per round so
drift on this shared 2-core box spreads over all variants. Writes JSON and prints one summary line with
each variant's ops/s and its ratio to "off".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import drive, summarize
from blobstore import launcher
from blobstore.plan import ClusterShape
from blobstore.procs import stop

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
    requests_measured = "blobstore_http_requests_total{" in httpx.get(f"{info.access_url}/metrics").text
    if requests_measured != metrics:
        raise RuntimeError(f"access in {root} measures requests: {requests_measured}, expected {metrics}")
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=10 << 10)
    parser.add_argument("--count", type=int, default=1000, help="PUTs per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/metrics_cost.json")
    args = parser.parse_args()
    latencies: dict[str, list[float]] = {name: [] for name in VARIANTS}
    elapsed = dict.fromkeys(VARIANTS, 0.0)
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        clusters: dict[str, launcher.ClusterInfo] = {}
        try:
            for name, (metrics, audit) in VARIANTS.items():
                clusters[name] = start(Path(tmp) / name.replace("+", "-"), metrics, audit)
            names = list(VARIANTS)
            for round_no in range(args.rounds):
                for name in names[round_no % len(names):] + names[:round_no % len(names)]:
                    got, took = asyncio.run(put_round(clusters[name].access_url, args.count, args.size))
                    latencies[name] += got
                    elapsed[name] += took
        finally:
            for info in clusters.values():
                launcher.down(Path(info.dir))
    results = {name: summarize(latencies[name], elapsed[name], args.size) for name in VARIANTS}
    off = results["off"]["ops_per_s"]
    ratios = {name: round(r["ops_per_s"] / off, 3) for name, r in results.items()}
    report = {"size": args.size, "count_per_round": args.count, "rounds": args.rounds, "concurrency": CONCURRENCY,
              "variants": results, "ratio_to_off": ratios}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    line = "; ".join(f"{name} {r['ops_per_s']:.0f}/s p50 {r['p50_ms']:.1f} ms (x{ratios[name]:.3f})"
                     for name, r in results.items())
    print(f"metrics cost, {args.size >> 10} KiB EC3P3 PUT c={CONCURRENCY}: {line}")


if __name__ == "__main__":
    main()
