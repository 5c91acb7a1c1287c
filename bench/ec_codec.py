"""Benchmark libs/ec: encode and rebuild-M-shards throughput per code mode and backend.

Figures are blob bytes per second (MB = 10^6 bytes), median of --runs, each set beside numpy
memcpy of the same number of bytes measured in the same run (the machine's ceiling for touching
that data). `encode` takes immutable bytes, whose data shards are views of the input;
`encode_copy` takes a bytearray, which is copied into the stripe buffer.
Run from the repo root: `.venv/bin/python bench/ec_codec.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from blobstore.memory import keep_freed_memory  # noqa: E402
from blobstore_server.libs.ec import BACKENDS, Codec, CodeMode, parse_code_mode  # noqa: E402
from blobstore_server.libs.ec.isal import library_path  # noqa: E402


def median_seconds(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm caches, decode tables and the allocator
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mbps(size: int, seconds: float) -> float:
    return size / seconds / 1e6


def bench_memcpy(size: int, runs: int) -> float:
    src = np.frombuffer(os.urandom(size), dtype=np.uint8)
    dst = np.empty_like(src)
    return mbps(size, median_seconds(lambda: np.copyto(dst, src), runs))


def threaded_mbps(fn: Callable[[], object], size: int, runs: int, threads: int = 2) -> float:
    """Aggregate throughput of `threads` callers (the codec releases the GIL in ISA-L and zfec)."""

    def loop(count: int) -> None:
        for _ in range(count):
            fn()  # results dropped at once, as a caller would after writing the shards

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(loop, [1] * threads))
        start = time.perf_counter()
        list(pool.map(loop, [runs] * threads))
        return mbps(size * runs * threads, time.perf_counter() - start)


def bench_codec(mode: CodeMode, backend: str, data: bytes, runs: int, memcpy: float) -> dict[str, float]:
    codec = Codec(mode, backend)
    m = codec.tactic.m
    shards = codec.encode(data)
    survivors: list[memoryview | None] = [None] * m + list(shards[m:])
    rebuilt = codec.reconstruct(survivors, range(m))
    assert all(bytes(rebuilt[i]) == bytes(shards[i]) for i in range(m)), f"{mode.name} {backend} rebuild"
    encode = mbps(len(data), median_seconds(lambda: codec.encode(data), runs))
    mutable = bytearray(data)  # cannot back shards in place: measures the copy into the stripe buffer
    encode_copy = mbps(len(data), median_seconds(lambda: codec.encode(mutable), runs))
    rebuild = mbps(len(data), median_seconds(lambda: codec.reconstruct(survivors, range(m)), runs))
    return {
        "encode_mbps": round(encode, 1),
        "encode_vs_memcpy": round(encode / memcpy, 3),
        "encode_copy_mbps": round(encode_copy, 1),
        "encode_copy_vs_memcpy": round(encode_copy / memcpy, 3),
        "encode_2threads_mbps": round(threaded_mbps(lambda: codec.encode(data), len(data), runs), 1),
        "rebuild_mbps": round(rebuild, 1),
        "rebuild_vs_memcpy": round(rebuild / memcpy, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4 * 1024 * 1024, help="blob bytes (default 4 MiB)")
    parser.add_argument("--modes", default=",".join(m.name for m in CodeMode), help="comma-separated")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per figure (median)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ec_codec.json")
    args = parser.parse_args()

    modes = [parse_code_mode(m) for m in args.modes.split(",")]
    backends = args.backends.split(",")
    data = os.urandom(args.size)
    memcpy = bench_memcpy(args.size, args.runs)
    results = {mode.name: {b: bench_codec(mode, b, data, args.runs, memcpy) for b in backends} for mode in modes}
    report = {
        "size": args.size,
        "runs": args.runs,
        "unit": "MB/s of blob bytes (10^6)",
        "isal_library": library_path(),
        "malloc_tuned": keep_freed_memory(),
        "memcpy_mbps": round(memcpy, 1),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")

    head = CodeMode.EC6P3.name if CodeMode.EC6P3 in modes else modes[0].name
    parts = [
        f"{b} encode {r['encode_mbps']:.0f} MB/s ({r['encode_vs_memcpy']:.2f}x memcpy) "
        f"rebuild {r['rebuild_mbps']:.0f} MB/s ({r['rebuild_vs_memcpy']:.2f}x)"
        for b, r in results[head].items()
    ]
    print(f"ec_codec: {head} {'; '.join(parts)}; memcpy {memcpy:.0f} MB/s [{args.out.relative_to(ROOT)}]")


if __name__ == "__main__":
    main()
