"""PUT/GET availability when processes die, measured as a user sees it.

Both modes bring a cluster up with the launcher (`make demo`'s shape: 3 clustermgr, 6 blobnodes x 2 disks, two
allocators, two access nodes, EC3P3) and run a steady stream of `--clients` concurrent loops, each doing a PUT
of `--size` random bytes and a GET of an earlier acknowledged object, recording every op (start, latency,
outcome, error). At the end every acknowledged object must read back byte for byte; JSON goes to `--out` and
one line is printed. Every process is stopped at the end, also on an error or Ctrl-C.

Default mode, a blobnode dies: the loops talk raw HTTP, loop i to access node i mod n only. After `--before`
seconds kill -9 the `--kill` blobnodes whose loss hurts writes most (they hold two or more units of the most
volumes) and keep the stream going for `--after` seconds (`--blobnodes 8 --kill 2` for the issue's second
case). The phase before the kill is the same-run baseline. Reports PUT and GET success rates and p50/p99
latency before the kill, in the first 10 s after it and from then on (bench/results/availability.json).

`--roles`, no single point of failure on the write path: the loops go through the SDK's AsyncClient given
every access URL, so a request fails over to another access node as a user's does. After `--before` seconds
of steady load (access sizes its standby stock from the PUT rate), in the same cluster and under the same
load: kill -9 each allocator in turn, left down 15 s; every allocator at once, down 30 s; one access node,
down 15 s; then one process of each other kind (the clustermgr leader, the worst blobnode, scheduler1, worker,
mqproxy, tinker, kafka, redis, dashboard), restarted 10 s after its kill as a supervisor would. A killed
process is restarted with `launcher.restart` (its recorded command), and the next kill follows 5 s after it
answers. For each kill: the names, seconds down, PUT and GET count / success rate / p99 / commonest errors
from the kill to 5 s after the restart, and a per-second series (second since the kill, PUT ok/total, PUT
p99, GET ok/total); also the baseline before the first kill, the whole run and all kill windows together
(bench/results/availability_roles.json). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import re
import signal
import ssl
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blobstore import AsyncClient, BlobstoreError
from blobstore.errors import error_from_answer
from blobstore_server.cluster import launcher
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.cluster.procs import poll
from blobstore_server.libs.proto.cluster import VolumeInfo
from blobstore_server.services.clustermgr.client import ClusterClient

SETTLE = 10.0  # seconds after the kill that the issue allows the cluster to adapt
ROLE_DOWN = 15.0  # --roles: seconds an allocator or an access node stays down
OUTAGE = 30.0  # --roles: seconds every allocator stays down at once
SUPERVISOR = 10.0  # --roles: any other process is restarted this long after its kill
TAIL = 5.0  # --roles: a kill's window ends this long after the restart answers; the next kill follows
RESTART_TIMEOUT = 120.0  # Kafka's JVM takes a while on two busy cores
ALL_ALLOCATORS = "all allocators"
TOKEN = re.compile(r"/blob/[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Op:
    kind: str  # "put" or "get"
    start: float  # seconds since the kill (negative: before it); with --roles since the stream began
    latency: float
    ok: bool
    error: str = ""  # why it failed (shortened)


def select(ops: list[Op], kind: str, lo: float, hi: float) -> list[Op]:
    return [o for o in ops if o.kind == kind and lo <= o.start < hi]


def phase(ops: list[Op], kind: str, lo: float, hi: float) -> dict[str, float]:
    chosen = select(ops, kind, lo, hi)
    if not chosen:
        return {"count": 0}
    latencies = sorted(o.latency for o in chosen)
    return {"count": len(chosen), "success_rate": round(sum(o.ok for o in chosen) / len(chosen), 5),
            "p50_ms": round(statistics.median(latencies) * 1e3, 1),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3, 1)}


def worst_victims(info: launcher.ClusterInfo, count: int) -> tuple[list[launcher.ProcessRecord], dict[str, int]]:
    """The `count` blobnodes whose loss hurts writes most: they hold two or more units of the most volumes
    (then the most units). Also how the volumes are spread, for the JSON."""
    async def volumes() -> list[VolumeInfo]:
        async with ClusterClient(info.clustermgr_urls) as cm:
            return list(await cm.list_volumes())

    listed = asyncio.run(volumes())
    nodes = [p for p in info.processes if p.role == "blobnode"]

    def harm(group: tuple[launcher.ProcessRecord, ...]) -> tuple[int, int, list[str]]:
        urls = {p.url for p in group}
        on_group = [sum(u.host in urls for u in v.units) for v in listed]
        return sum(n >= 2 for n in on_group), sum(on_group), [p.name for p in group]

    worst = max(itertools.combinations(nodes, count), key=harm)
    spread = {"volumes": len(listed),
              "volumes_with_two_units_on_one_host": sum(len({u.host for u in v.units}) < len(v.units) for v in listed),
              "volumes_losing_two_or_more_units": harm(worst)[0]}
    return list(worst), spread


class Mismatch(Exception):
    """A GET answered other bytes than the PUT stored."""


# What a failed op raises: the SDK's errors, raw HTTP's, a read of the wrong bytes.
FAILURES = (BlobstoreError, aiohttp.ClientError, httpx.HTTPError, TimeoutError, Mismatch)


class Transport(Protocol):
    """How loop number `loop` stores an object (its location token back) and reads one; failing, it raises."""

    async def put(self, loop: int, data: bytes) -> str: ...

    async def get(self, loop: int, token: str) -> bytes: ...


class Pinned:
    """Raw HTTP, loop i pinned to access node i mod n (a GET may read what another node stored)."""

    def __init__(self, session: aiohttp.ClientSession, access: list[str]) -> None:
        self.session = session
        self.access = access

    async def put(self, loop: int, data: bytes) -> str:
        async with self.session.put(f"{self.access[loop % len(self.access)]}/blob", data=data) as resp:
            body = await resp.read()
        if resp.status != 200:
            raise error_from_answer(resp.status, body, "PUT /blob")
        return str(json.loads(body)["location"])

    async def get(self, loop: int, token: str) -> bytes:
        async with self.session.get(f"{self.access[loop % len(self.access)]}/blob/{token}") as resp:
            body = await resp.read()
        if resp.status != 200:
            raise error_from_answer(resp.status, body, "GET /blob/<token>")
        return body


class ThroughSdk:
    """The SDK, given every access URL: each request fails over to another access node as a user's does."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def put(self, loop: int, data: bytes) -> str:
        return await self.client.put(data)

    async def get(self, loop: int, token: str) -> bytes:
        return await self.client.get(token)


@asynccontextmanager
async def pinned(access: list[str]) -> AsyncIterator[Transport]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield Pinned(session, access)


@asynccontextmanager
async def through_sdk(access: list[str], ca: str | None = None) -> AsyncIterator[Transport]:
    async with AsyncClient(access, ca=ca) as client:
        yield ThroughSdk(client)


async def drive(transport: AbstractAsyncContextManager[Transport], clients: int, size: int,
                scenario: Callable[[], Awaitable[float]]) -> tuple[list[Op], dict[str, bytes]]:
    """Run `clients` PUT/GET loops through `transport` while `scenario` runs (the loops stop when it returns;
    an exception of it is raised once they have). It returns the moment (time.monotonic()) that each op's
    start is counted from. Also returns every acknowledged object."""
    raw: list[tuple[str, float, float, str | None]] = []  # kind, start, latency, error (None: ok)
    acked: dict[str, bytes] = {}
    tokens: list[str] = []  # acked's keys, to pick from
    done = asyncio.Event()

    async def timed(kind: str, call: Awaitable[None]) -> None:
        t0 = time.monotonic()
        error = None
        try:
            await call
        except FAILURES as exc:
            error = TOKEN.sub("/blob/<token>", f"{type(exc).__name__}: {exc}")[:600]  # alike errors count as one
        raw.append((kind, t0, time.monotonic() - t0, error))

    async def put(via: Transport, loop: int, data: bytes) -> None:
        token = await via.put(loop, data)
        acked[token] = data
        tokens.append(token)

    async def get(via: Transport, loop: int, token: str) -> None:
        if await via.get(loop, token) != acked[token]:
            raise Mismatch("GET: not the bytes acknowledged")

    async def loop(via: Transport, seed: int) -> None:
        rng = random.Random(seed)
        while not done.is_set():
            await timed("put", put(via, seed, rng.randbytes(size)))
            if tokens:
                await timed("get", get(via, seed, rng.choice(tokens)))

    async def directed() -> float:
        try:
            return await scenario()
        finally:
            done.set()

    async with transport as via:
        running = asyncio.create_task(directed())
        await asyncio.gather(*(loop(via, s) for s in range(clients)))
        zero = await running
    return [Op(kind, t0 - zero, latency, error is None, error or "") for kind, t0, latency, error in raw], acked


async def stream(access: list[str], clients: int, size: int, before: float, after: float,
                 kill: Callable[[], None]) -> tuple[list[Op], dict[str, bytes]]:
    """Run the PUT/GET loops, loop i through access node i mod len(access) (a GET may read what another
    node stored); calls `kill()` after `before` seconds and stops `after` seconds later.
    Each op's start is given in seconds relative to the kill."""
    async def scenario() -> float:
        await asyncio.sleep(before)
        killed_at = time.monotonic()
        kill()
        await asyncio.sleep(after)
        return killed_at

    return await drive(pinned(access), clients, size, scenario)


async def read_back(access: list[str], acked: dict[str, bytes], ca: str | None = None) -> int:
    """How many acknowledged objects do not read back byte for byte (read through the access nodes in turn, https
    ones checked against the CA `ca`)."""
    bad = 0
    tls = ssl.create_default_context(cafile=ca) if ca else True
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120),
                                     connector=aiohttp.TCPConnector(ssl=tls)) as session:
        sem = asyncio.Semaphore(8)

        async def one(url: str, token: str, data: bytes) -> None:
            nonlocal bad
            try:
                async with sem, session.get(f"{url}/blob/{token}") as resp:
                    if resp.status != 200 or await resp.read() != data:
                        bad += 1
            except (aiohttp.ClientError, TimeoutError):
                bad += 1

        await asyncio.gather(*(one(access[i % len(access)], t, d) for i, (t, d) in enumerate(acked.items())))
    return bad


@contextmanager
def cluster(blobnodes: int) -> Iterator[tuple[Path, launcher.ClusterInfo]]:
    """A cluster in a temporary folder, every process of it stopped on the way out, whatever happened."""
    with tempfile.TemporaryDirectory(prefix="bench-avail-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(blobnodes=blobnodes), timeout=120.0)
        try:
            yield root, info
        finally:
            launcher.down(root)


def blobnode_mode(args: argparse.Namespace) -> None:
    with cluster(args.blobnodes) as (_, info):
        victims, spread = worst_victims(info, args.kill)

        def kill() -> None:
            for victim in victims:
                os.kill(victim.pid, signal.SIGKILL)

        ops, acked = asyncio.run(stream(info.access_urls, args.clients, args.size, args.before, args.after, kill))
        unreadable = asyncio.run(read_back(info.access_urls, acked))
    result = {
        "shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, EC3P3", "clients": args.clients,
        "size": args.size, "killed": [v.name for v in victims], **spread,
        "before_kill": {k: phase(ops, k, -args.before, 0.0) for k in ("put", "get")},
        "first_10s_after": {k: phase(ops, k, 0.0, SETTLE) for k in ("put", "get")},
        "after_10s": {k: phase(ops, k, SETTLE, args.after + 1) for k in ("put", "get")},
        "acked_puts": len(acked), "acked_not_readable": unreadable,
    }
    write(args.out or "bench/results/availability.json", result)
    b, f, a = (result[p]["put"] for p in ("before_kill", "first_10s_after", "after_10s"))
    print(f"availability (kill -9 {'+'.join(v.name for v in victims)} of {args.blobnodes}, {args.clients} clients, "
          f"{args.size >> 10} KiB PUT+GET; {spread['volumes_losing_two_or_more_units']} of {spread['volumes']}"
          f" volumes lose 2+ units): "
          f"PUT ok {b['success_rate']:.2%} p99 {b['p99_ms']:.0f} ms before; "
          f"{f['success_rate']:.2%} p99 {f['p99_ms']:.0f} ms in the first 10 s; "
          f"{a['success_rate']:.2%} p99 {a['p99_ms']:.0f} ms after; "
          f"{len(acked)} acked, {unreadable} unreadable")


@dataclass(frozen=True)
class Kill:
    """A step of --roles: `names()` says whom to kill when it is time (the leader changes), `down` how long
    they stay down before they are restarted."""

    label: str
    down: float
    names: Callable[[], list[str]]


@dataclass(frozen=True)
class Killed:
    label: str
    names: list[str]
    down: float  # planned
    at: float  # seconds since the stream began
    answered: dict[str, float]  # name -> seconds since the stream began when it answered after its restart

    @property
    def back(self) -> float:
        return max(self.answered.values())


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def role_kills(root: Path, info: launcher.ClusterInfo) -> list[Kill]:
    """Each allocator, every allocator, one access node; then one process of each other kind."""
    by_role: dict[str, list[str]] = {}
    for p in info.processes:
        by_role.setdefault(p.role, []).append(p.name)

    def named(*names: str) -> Callable[[], list[str]]:
        return lambda: list(names)

    def leader() -> list[str]:
        name = launcher.status(root).leader
        if name is None:
            raise launcher.LauncherError("no clustermgr leads")
        return [name]

    allocators = by_role["allocator"]
    blobnode = worst_victims(info, 1)[0][0].name
    others = ("scheduler", "worker", "mqproxy", "tinker", "kafka", "redis", "dashboard")
    return [*(Kill("allocator", ROLE_DOWN, named(name)) for name in allocators),
            Kill(ALL_ALLOCATORS, OUTAGE, named(*allocators)),
            Kill("access", ROLE_DOWN, named(by_role["access"][0])),
            Kill("clustermgr leader", SUPERVISOR, leader),
            Kill("blobnode (the worst)", SUPERVISOR, named(blobnode)),
            *(Kill(role, SUPERVISOR, named(by_role[role][0])) for role in others)]


def kill9(root: Path, name: str) -> None:
    """kill -9 `name` by the pid cluster.json records now (a restart changes it); returns once it is gone."""
    record = next((p for p in launcher.ClusterInfo.load(root).processes if p.name == name), None)
    if record is None:
        raise launcher.LauncherError(f"no process {name} in {root}/")
    if not record.running:
        raise launcher.LauncherError(f"{name} (pid {record.pid}) was not running when its kill came")
    os.kill(record.pid, signal.SIGKILL)
    if not poll(lambda: not record.running, 10.0):
        raise launcher.LauncherError(f"{name} (pid {record.pid}) survived kill -9")


def kill_in_turn(root: Path, kills: list[Kill], before: float, log: list[Killed],
                 aborted: list[str]) -> Callable[[], Awaitable[float]]:
    """The --roles scenario: `before` s of steady load, then each of `kills` in turn, appended to `log` when
    done. A kill or restart that fails ends it early, its error in `aborted`."""
    async def scenario() -> float:
        zero = time.monotonic()
        await asyncio.sleep(before)
        for step in kills:
            try:
                names = await asyncio.to_thread(step.names)
                at = time.monotonic()
                for name in names:
                    await asyncio.to_thread(kill9, root, name)
                say(f"{at - zero:6.1f}s kill -9 {'+'.join(names)}; restart in {step.down:.0f} s")
                await asyncio.sleep(max(0.0, at + step.down - time.monotonic()))
                answered: dict[str, float] = {}
                for name in names:  # one by one: the time each answers again is reported
                    await asyncio.to_thread(launcher.restart, root, name, timeout=RESTART_TIMEOUT)
                    answered[name] = time.monotonic() - zero
            except (launcher.LauncherError, OSError, RuntimeError, TimeoutError) as exc:
                aborted.append(f"{step.label}: {type(exc).__name__}: {exc}")
                say(f"aborted: {aborted[-1]}")
                return zero
            killed = Killed(step.label, names, step.down, at - zero, answered)
            say(f"{killed.back:6.1f}s {'+'.join(names)} answer again ("
                + ", ".join(f"{name} {t - killed.at:.1f} s" for name, t in answered.items()) + " after the kill)")
            log.append(killed)
            await asyncio.sleep(TAIL)
        return zero

    return scenario


def counted(ops: list[Op], kind: str, lo: float, hi: float) -> dict[str, Any]:
    """phase() plus how many failed and why (the three commonest errors)."""
    failed = [o for o in select(ops, kind, lo, hi) if not o.ok]
    return {**phase(ops, kind, lo, hi), "failed": len(failed),
            "errors": Counter(o.error for o in failed).most_common(3)}


def ratio(ops: list[Op]) -> str:
    return f"{sum(o.ok for o in ops)}/{len(ops)}"


def kill_report(ops: list[Op], k: Killed) -> dict[str, Any]:
    lo, hi = k.at, k.back + TAIL
    window = [o for o in ops if lo <= o.start < hi]
    series = [{"s": s, "put": ratio(select(window, "put", lo + s, lo + s + 1)),
               "put_p99_ms": phase(window, "put", lo + s, lo + s + 1).get("p99_ms"),
               "get": ratio(select(window, "get", lo + s, lo + s + 1))} for s in range(math.ceil(hi - lo))]
    return {"kill": k.label, "names": k.names, "at_s": round(k.at, 1), "restarted_after_s": k.down,
            "down_s": round(k.back - k.at, 1), "window_s": round(hi - lo, 1),
            "answered_after_s": {name: round(t - k.at, 1) for name, t in k.answered.items()},
            "put": counted(window, "put", lo, hi), "get": counted(window, "get", lo, hi), "series": series}


def roles_mode(args: argparse.Namespace) -> None:
    log: list[Killed] = []
    aborted: list[str] = []
    with cluster(args.blobnodes) as (root, info):
        kills = role_kills(root, info)
        say(f"{len(kills)} kills under {args.clients} clients through {', '.join(info.access_urls)}; "
            f"{args.before:.0f} s of baseline first")
        scenario = kill_in_turn(root, kills, args.before, log, aborted)
        ops, acked = asyncio.run(drive(through_sdk(info.access_urls), args.clients, args.size, scenario))
        say(f"reading back {len(acked)} acknowledged objects")
        unreadable = asyncio.run(read_back(info.access_urls, acked))
    windows = [(k.at, k.back + TAIL) for k in log]
    in_windows = [o for o in ops if any(lo <= o.start < hi for lo, hi in windows)]
    everything = (-math.inf, math.inf)
    reports = [kill_report(ops, k) for k in log]
    result = {
        "mode": "roles", "shape": f"3 clustermgr, {args.blobnodes} blobnodes x 2 disks, 2 allocators, "
        f"{len(info.access_urls)} access nodes, EC3P3", "clients": args.clients, "size": args.size,
        "access_nodes": len(info.access_urls), "client": "blobstore.AsyncClient(every access URL)",
        "baseline": {k: counted(ops, k, 0.0, log[0].at if log else math.inf) for k in ("put", "get")},
        "whole_run": {k: counted(ops, k, *everything) for k in ("put", "get")},
        "during_kills": {k: counted(in_windows, k, *everything) for k in ("put", "get")},
        "kills": reports, "aborted": aborted[0] if aborted else None,
        "acked_puts": len(acked), "acked_not_readable": unreadable,
    }
    write(args.out or "bench/results/availability_roles.json", result)
    print(roles_line(result))


def roles_line(result: dict[str, Any]) -> str:
    """The one line --roles prints, from its JSON."""
    def ms(stats: dict[str, Any]) -> str:
        return f"{stats['p99_ms']:.0f} ms" if stats["count"] else "-"

    reports: list[dict[str, Any]] = result["kills"]
    whole, during = result["whole_run"]["put"], result["during_kills"]["put"]
    worst = max(reports, key=lambda r: r["put"]["failed"], default=None)
    outage = next((r for r in reports if r["kill"] == ALL_ALLOCATORS), None)
    parts = [f"baseline PUT p99 {ms(result['baseline']['put'])}, {ms(during)} during kills",
             f"whole run PUT ok {whole['success_rate']:.3%} ({whole['failed']} of {whole['count']} failed)"]
    if worst is not None and worst["put"]["failed"]:
        parts.append(f"worst kill {worst['kill']} ({'+'.join(worst['names'])}) {worst['put']['failed']} failed PUTs")
    elif worst is not None:
        parts.append("no kill failed a PUT")
    if outage is not None and outage["put"]["count"]:
        parts.append(f"{ALL_ALLOCATORS} down {outage['restarted_after_s']:.0f} s (back after {outage['down_s']:.0f} s):"
                     f" PUT ok {outage['put']['success_rate']:.2%} ({outage['put']['failed']} of "
                     f"{outage['put']['count']} failed)")
    parts.append(f"{result['acked_puts']} acked, {result['acked_not_readable']} unreadable")
    if result["aborted"]:
        parts.append(f"ABORTED {result['aborted']}")
    return (f"availability --roles ({len(reports)} kills in one cluster, {result['clients']} clients, "
            f"{result['size'] >> 10} KiB PUT+GET through the SDK over {result['access_nodes']} access nodes): "
            + "; ".join(parts))


def write(path: str, result: dict[str, Any]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roles", action="store_true",
                        help="kill each kind of process in turn under load through the SDK (see above)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--before", type=float, default=15.0, help="seconds of steady load before the first kill")
    parser.add_argument("--after", type=float, default=40.0, help="seconds of load after the blobnode kill")
    parser.add_argument("--blobnodes", type=int, default=6)
    parser.add_argument("--kill", type=int, default=1, help="how many blobnodes to kill -9 at once")
    parser.add_argument("--out", help="default bench/results/availability.json, with --roles "
                                      "bench/results/availability_roles.json")
    args = parser.parse_args()
    (roles_mode if args.roles else blobnode_mode)(args)


if __name__ == "__main__":
    main()
