"""Shard put/get throughput and latency of a real blobnode, next to raw pwrite/pread of the same sizes.

Starts one blobnode (fsync on) on a temp dir, drives it with `--concurrency` concurrent requests per
size (`--in-flight 1`: small ones coalesced into batches beyond one on its way, as access sends them), then
does the same count of os.pwrite+fdatasync / os.pread of the same sizes with the same concurrency (threads)
to a file in the same temp dir. Also reports the blobnode's CPU (user + system) per operation, the figure its
group commit and event-loop writes of small shards cut. Writes JSON and prints one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_seconds, drive, summarize
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import operator_signer
from blobstore_server.services.blobnode.client import BlobnodeClient
from tests.support.processes import TEST_SECRET, Service, free_port

SIZES = {"4KiB": 4 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20, "4MiB": 4 << 20}


async def put_one(client: BlobnodeClient, url: str, vuid: int, data: bytes, bid: int) -> int:
    return await client.put_shard(url, 1, vuid, bid, data)


async def get_one(client: BlobnodeClient, url: str, vuid: int, bid: int) -> bytes:
    return await client.get_shard(url, 1, vuid, bid)


async def measured(pid: int, count: int, run: Awaitable[tuple[list[float], float]], size: int) -> dict[str, float]:
    """`run`'s summary plus the blobnode's CPU milliseconds per operation."""
    before = cpu_seconds(pid)
    summary = summarize(*await run, size)
    return {**summary, "server_cpu_ms_per_op": round((cpu_seconds(pid) - before) / count * 1e3, 3)}


async def bench_blobnode(url: str, pid: int, count_for: dict[str, int],
                         concurrency: int, in_flight: int) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    async with BlobnodeClient(in_flight=in_flight) as client:
        for vid, (name, size) in enumerate(SIZES.items(), start=1):
            vuid = Vuid.make(vid, 0, 1)
            await client.create_chunk(url, 1, vuid)
            data = os.urandom(size)
            count = count_for[name]
            put = await measured(pid, count, drive(count, concurrency, functools.partial(put_one, client, url, vuid,
                                                                                          data)), size)
            get = await measured(pid, count, drive(count, concurrency, functools.partial(get_one, client, url, vuid)),
                                 size)
            results[name] = {"put": put, "get": get}
    return results


def bench_raw(directory: Path, count_for: dict[str, int], concurrency: int) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    with ThreadPoolExecutor(concurrency) as pool:
        for name, size in SIZES.items():
            path = directory / f"raw-{name}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            data = os.urandom(size)
            count = count_for[name]

            def write(i: int, fd: int = fd, data: bytes = data, size: int = size) -> float:
                t0 = time.perf_counter()
                os.pwrite(fd, data, i * size)
                os.fdatasync(fd)
                return time.perf_counter() - t0

            def read(i: int, fd: int = fd, size: int = size) -> float:
                t0 = time.perf_counter()
                os.pread(fd, size, i * size)
                return time.perf_counter() - t0

            entry: dict[str, object] = {}
            for op_name, op in (("put", write), ("get", read)):
                start = time.perf_counter()
                latencies = list(pool.map(op, range(count)))
                entry[op_name] = summarize(latencies, time.perf_counter() - start, size)
            results[name] = entry
            os.close(fd)
            path.unlink()
    return results


def main() -> None:
    auth.install(operator_signer(TEST_SECRET))  # the services run with the test fixtures' keys, as deployed
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the op counts")
    parser.add_argument("--in-flight", type=int, default=0,
                        help="coalesce small puts and reads beyond this many on their way, as access does (0: never)")
    parser.add_argument("--out", default="bench/results/blobnode.json")
    args = parser.parse_args()
    base_counts = {"4KiB": 3000, "64KiB": 2000, "1MiB": 400, "4MiB": 120}
    count_for = {k: max(args.concurrency, int(v * args.scale)) for k, v in base_counts.items()}
    with tempfile.TemporaryDirectory(prefix="bench-blobnode-", dir=os.environ.get("BENCH_DIR")) as tmp:
        workdir = Path(tmp)
        port = free_port()
        config = {"bind_addr": f"127.0.0.1:{port}", "disks": [{"path": str(workdir / "disk1"), "disk_id": 1}]}
        service = Service("blobnode", config, workdir, f"http://127.0.0.1:{port}")
        service.start()
        try:
            node = asyncio.run(bench_blobnode(service.url, service.pid, count_for, args.concurrency, args.in_flight))
        finally:
            service.stop()
        raw = bench_raw(workdir, count_for, args.concurrency)
    ratios = {name: {op: round(node[name][op]["mb_per_s"] / raw[name][op]["mb_per_s"], 3)  # type: ignore[index]
                     for op in ("put", "get")} for name in SIZES}
    result = {"concurrency": args.concurrency, "in_flight": args.in_flight, "counts": count_for, "blobnode": node,
              "raw_file_io": raw, "ratio_vs_raw": ratios}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    parts = [f"{name} put {node[name]['put']['ops_per_s']:.0f}/s ({ratios[name]['put']}x raw, "  # type: ignore[index]
             f"{node[name]['put']['server_cpu_ms_per_op']} ms CPU) "  # type: ignore[index]
             f"get {node[name]['get']['ops_per_s']:.0f}/s ({ratios[name]['get']}x raw, "  # type: ignore[index]
             f"{node[name]['get']['server_cpu_ms_per_op']} ms CPU)"  # type: ignore[index]
             for name in SIZES]
    print(f"blobnode (c={args.concurrency}, in flight {args.in_flight or 'any'}, fsync): " + "; ".join(parts))


if __name__ == "__main__":
    main()
