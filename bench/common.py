"""What the benchmarks share: driving an operation with N concurrent loops, and summarizing latencies."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


async def drive(count: int, concurrency: int, op: Callable[[int], Awaitable[object]]) -> tuple[list[float], float]:
    """Run `op(0..count-1)` with `concurrency` loops; returns each call's latency and the wall time."""
    latencies: list[float] = []
    indexes = iter(range(count))

    async def worker() -> None:
        for i in indexes:
            t0 = time.perf_counter()
            await op(i)
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - start


def summarize(latencies: list[float], elapsed: float, size: int) -> dict[str, float]:
    ordered = sorted(latencies)
    ops = len(ordered) / elapsed
    return {"ops_per_s": round(ops, 1), "mb_per_s": round(ops * size / 1e6, 1),
            "p50_ms": round(statistics.median(ordered) * 1e3, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3)}


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU of one process and, unless `children` is False, of its children (a blobnode's background
    reader) so far (Linux /proc; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if children else []
    except OSError:
        return 0.0
    ended = int(fields[13]) + int(fields[14]) if children else 0  # children that exited and were waited for
    return (int(fields[11]) + int(fields[12]) + ended) / _TICK + sum(cpu_seconds(int(kid)) for kid in kids)
