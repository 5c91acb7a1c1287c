"""PUT/GET (and DELETE) as a user sees them through network partitions, second by second.

Brings up `cluster up --hosts 8` (as root: clustermgr on h1-h3, Kafka on h4-h6, the access nodes alone on h7
and h8, a blobnode on every host, EC3P3) and runs `--clients` PUT+GET loops through the SDK given both access
URLs, as an application would, while the nemesis makes the partitions of tests/fault/test_partitions.py in
turn, each `--cut` seconds and followed by `--tail` seconds healed:
  b  h5's blobnode unreachable by both access nodes (clustermgr still hears it);
  d  Kafka's brokers cut from mqproxy's and tinker's hosts (a DELETE loop runs too);
  e  both access nodes cut from clustermgr and the allocators (not from the blobnodes);
  f  h1 (a clustermgr, an allocator) and h8 (an access node) cut from the six other hosts.
The first `--before` seconds are the same-run baseline. For each scenario: PUT, GET (and for d DELETE) count,
success rate, p50/p99 over the cut and over the tail, and a per-second series. At the end every acknowledged
object must read back. JSON to bench/results/partitions.json, one line printed; every process and namespace
is removed at the end, also on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.availability import Op, counted, drive, ratio, read_back, say, select, through_sdk, write
from blobstore import AsyncClient, BlobstoreError
from blobstore_server.cluster import launcher, nemesis
from blobstore_server.cluster.netns import Network
from blobstore_server.cluster.plan import ClusterShape

HOSTS = 8
MAJORITY = ["h2", "h3", "h4", "h5", "h6", "h7"]


@dataclass
class Window:
    name: str
    what: str
    cut_at: float = 0.0  # seconds since the stream's zero
    healed_at: float = 0.0
    deletes: list[Op] = field(default_factory=list)


def services(info: launcher.ClusterInfo, *roles: str) -> list[tuple[str, int]]:
    return [(p.host, int(p.url.rsplit(":", 1)[1])) for p in info.processes if p.role in roles]


def partitions(info: launcher.ClusterInfo, net: Network) -> list[tuple[Window, Callable[[], None]]]:
    brokers = services(info, "kafka")
    control = services(info, "clustermgr", "allocator")

    def b() -> None:
        nemesis.cut(net, "h5", ["h7", "h8"])

    def d() -> None:
        for host in ("h3", "h1"):
            nemesis.cut_services(net, host, brokers)

    def e() -> None:
        for host in ("h7", "h8"):
            nemesis.cut_services(net, host, control)

    def f() -> None:
        for host in ("h1", "h8"):
            nemesis.cut(net, host, MAJORITY)

    return [(Window("b", "a blobnode host unreachable by access"), b),
            (Window("d", "Kafka cut from mqproxy and tinker"), d),
            (Window("e", "access cut from clustermgr and allocators"), e),
            (Window("f", "majority/minority split (h1+h8 vs the rest)"), f)]


async def delete_loop(access: list[str], ca: str | None, window: Window, zero: float, until: float) -> None:
    """PUT an object and DELETE it, again and again, recording each DELETE's answer."""
    async with AsyncClient(access, timeout=60, ca=ca) as client:
        while time.monotonic() < until:
            try:
                token = await client.put(os.urandom(4096))
            except BlobstoreError:
                continue
            started = time.monotonic()
            error = ""
            try:
                await client.delete(token)
            except BlobstoreError as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            window.deletes.append(Op("delete", started - zero, time.monotonic() - started, not error, error))


def scenario_of(info: launcher.ClusterInfo, net: Network, cuts: list[tuple[Window, Callable[[], None]]],
                before: float, cut: float, tail: float) -> Callable[[], Any]:
    async def scenario() -> float:
        zero = time.monotonic()
        await asyncio.sleep(before)
        for window, make in cuts:
            say(f"{window.name}: {window.what}")
            window.cut_at = time.monotonic() - zero
            until = time.monotonic() + cut + tail
            deletes = (asyncio.create_task(delete_loop(info.access_urls, info.ca, window, zero, until))
                       if window.name == "d" else None)
            try:
                await asyncio.to_thread(make)
                await asyncio.sleep(cut)
            finally:
                await asyncio.to_thread(nemesis.heal_all, net)
            window.healed_at = time.monotonic() - zero
            await asyncio.sleep(tail)
            if deletes is not None:
                await deletes
        return zero

    return scenario


def latency_ms(ops: list[Op]) -> dict[str, float | None]:
    ordered = sorted(o.latency for o in ops)
    if not ordered:
        return {"p50_ms": None, "p99_ms": None}
    return {"p50_ms": round(statistics.median(ordered) * 1e3, 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 1)}


def report(ops: list[Op], w: Window, tail: float) -> dict[str, Any]:
    end = w.healed_at + tail
    kinds = ("put", "get", "delete") if w.deletes else ("put", "get")
    every = ops + w.deletes
    series = [{"s": s, **{k: ratio(select(every, k, w.cut_at + s, w.cut_at + s + 1)) for k in kinds},
               **{f"{k}_{p}": latency_ms(select(every, k, w.cut_at + s, w.cut_at + s + 1))[p]
                  for k in ("put", "get") for p in ("p50_ms", "p99_ms")}}
              for s in range(math.ceil(end - w.cut_at))]
    return {"scenario": w.name, "what": w.what, "cut_s": round(w.healed_at - w.cut_at, 1), "tail_s": tail,
            "cut": {k: counted(every, k, w.cut_at, w.healed_at) for k in kinds},
            "after_heal": {k: counted(every, k, w.healed_at, end) for k in kinds},
            "series": series}


def summary(result: dict[str, Any]) -> str:
    base = result["baseline"]["put"]
    parts = [f"baseline PUT p99 {base.get('p99_ms', '-')} ms"]
    for r in result["scenarios"]:
        put = r["cut"]["put"]
        text = (f"{r['scenario']}: PUT ok {put.get('success_rate', 0):.1%} p99 {put.get('p99_ms', '-')} ms, "
                f"GET ok {r['cut']['get'].get('success_rate', 0):.1%}")
        if "delete" in r["cut"]:
            text += f", DELETE ok {r['cut']['delete'].get('success_rate', 0):.0%}"
        parts.append(text)
    parts.append(f"{result['acked_puts']} acked, {result['acked_not_readable']} unreadable")
    return (f"partitions ({result['hosts']} hosts, {result['clients']} clients, {result['size'] >> 10} KiB PUT+GET "
            f"through the SDK, cuts of {result['cut_s']:.0f} s): " + "; ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--size", type=int, default=16 << 10)
    parser.add_argument("--before", type=float, default=15.0, help="seconds of baseline before the first cut")
    parser.add_argument("--cut", type=float, default=20.0, help="seconds each partition lasts")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds after each heal")
    parser.add_argument("--out", default="bench/results/partitions.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/partitions.py needs root (network namespaces)")
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(blobnodes=HOSTS, disks_per_node=1), hosts=HOSTS, timeout=120.0)
        try:
            net = info.net()
            assert net is not None
            cuts = partitions(info, net)
            scenario = scenario_of(info, net, cuts, args.before, args.cut, args.tail)
            ops, acked = asyncio.run(drive(through_sdk(info.access_urls, info.ca), args.clients, args.size, scenario))
            say(f"reading back {len(acked)} acknowledged objects")
            unreadable = asyncio.run(read_back(info.access_urls, acked, info.ca))
        finally:
            launcher.down(root)
    first = cuts[0][0].cut_at
    result = {"hosts": HOSTS, "clients": args.clients, "size": args.size, "cut_s": args.cut, "tail_s": args.tail,
              "client": "blobstore.AsyncClient(both access URLs)",
              "baseline": {k: counted(ops, k, 0.0, first) for k in ("put", "get")},
              "scenarios": [report(ops, w, args.tail) for w, _ in cuts],
              "acked_puts": len(acked), "acked_not_readable": unreadable}
    write(args.out, result)
    print(summary(result))


if __name__ == "__main__":
    main()
