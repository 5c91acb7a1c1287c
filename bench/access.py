"""PUT and GET through access on a whole local cluster, next to plain file I/O of the same bytes.

Brings a cluster up with the launcher (3 clustermgr, 6 blobnodes x 2 disks, EC3P3, fsync on) in a
temp dir, then for 10 KiB, 1 MiB and 64 MiB objects with 1 and 8 concurrent clients measures ops/s,
MB/s and p50/p99 latency; the baseline writes (with fdatasync) and reads the same objects as plain
files in the same temp dir with the same concurrency. Writes JSON and prints one summary line.
CubeFS publishes ~620-740 PUT op/s and ~1.3k GET op/s for 10 KiB EC3P3 objects with 2 client threads.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import drive, summarize
from blobstore import launcher
from blobstore.plan import ClusterShape

SIZES = {"10KiB": 10 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}
COUNTS = {"10KiB": 1500, "1MiB": 200, "64MiB": 6}


async def bench_access(url: str, name: str, size: int, count: int, concurrency: int) -> dict[str, object]:
    data = os.urandom(size)
    tokens: dict[int, str] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def put(i: int) -> None:
            async with session.put(f"{url}/blob", data=data) as resp:
                assert resp.status == 200, await resp.text()
                tokens[i] = (await resp.json())["location"]

        async def get(i: int) -> None:
            async with session.get(f"{url}/blob/{tokens[i]}") as resp:
                assert resp.status == 200
                got = 0
                async for chunk in resp.content.iter_chunked(1 << 20):
                    got += len(chunk)
                assert got == size

        puts = await drive(count, concurrency, put)
        gets = await drive(count, concurrency, get)
    return {"put": summarize(*puts, size), "get": summarize(*gets, size)}


async def bench_files(directory: Path, size: int, count: int, concurrency: int) -> dict[str, object]:
    data = os.urandom(size)

    def write(i: int) -> None:
        fd = os.open(directory / f"obj{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def read(i: int) -> None:
        assert len((directory / f"obj{i}").read_bytes()) == size

    results: dict[str, object] = {}
    for op_name, fn in (("put", write), ("get", read)):
        run = await drive(count, concurrency, lambda i, fn=fn: asyncio.to_thread(fn, i))  # type: ignore[misc]
        results[op_name] = summarize(*run, size)
    for i in range(count):
        (directory / f"obj{i}").unlink()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the object counts")
    parser.add_argument("--out", default="bench/results/access.json")
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-access-") as tmp:
        root = Path(tmp)
        info = launcher.up(root / "cluster", ClusterShape(chunk_size=8 << 30))
        try:
            files = root / "files"
            files.mkdir()
            for name, size in SIZES.items():
                for concurrency in (1, 8):
                    count = max(concurrency, int(COUNTS[name] * args.scale))
                    key = f"{name} c={concurrency}"
                    ours = asyncio.run(bench_access(info.access_url, name, size, count, concurrency))
                    plain = asyncio.run(bench_files(files, size, count, concurrency))
                    results[key] = {"count": count, "access": ours, "plain_files": plain}
        finally:
            launcher.down(root / "cluster")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    line = "; ".join(f"{k} put {v['access']['put']['ops_per_s']:.0f}/s get {v['access']['get']['ops_per_s']:.0f}/s"  # type: ignore[index]
                     f" (files {v['plain_files']['put']['ops_per_s']:.0f}/{v['plain_files']['get']['ops_per_s']:.0f})"  # type: ignore[index]
                     for k, v in results.items())
    print(f"access (EC3P3, fsync): {line}")


if __name__ == "__main__":
    main()
