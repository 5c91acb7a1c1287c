"""libs/raft benchmark: 3 kvserver processes on 127.0.0.1, fsync on, next to PySyncObj 0.3.17;
and 3 clustermgr replicas behind `ClusterClient`.

Measures committed puts/s with many concurrent clients (group commit and batching at work), one
put at a time (p50/p99 latency), failover (kill -9 of the leader to the first acknowledged write)
and the catch-up of a wiped node. PySyncObj runs the same put into a replicated dict, driven
inside its leader process (it has no client protocol), so its figures exclude a client hop that
ours include. On clustermgr: the write stall under a paused leader (SIGSTOP: the longest wait of a
write in flight during the pause, median and max over several pauses), and commits/s of kv writes
with client sessions on and off in the same run (alternating rounds). Writes bench/results/raft.json
and prints one summary line. `--sections paused` runs against any checkout (e.g. main's code, for
the stall before the client learned to look for a new leader).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.clustermgr import rate, start_clustermgr  # noqa: E402
from bench.common import cpu_seconds  # noqa: E402
from blobstore_server.services.clustermgr.client import ClusterClient  # noqa: E402
from tests.support.processes import Service, stop_all  # noqa: E402
from tests.support.raftkv.kvclient import KVClient  # noqa: E402
from tests.support.raftkv.kvcluster import LocalCluster, free_port  # noqa: E402
from tests.support.waiting import eventually  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "raft.json"
SECTIONS = ("raft", "pysyncobj", "paused", "sessions")
VALUE = b"v" * 32


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ------------------------------------------------------------------------- libs/raft
async def _throughput(cluster: LocalCluster, clients: int, seconds: float) -> dict[str, Any]:
    client = cluster.client(timeout=10)
    await cluster.wait_leader(client)
    done = 0
    stop = False

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while not stop:
            await client.put(b"t%d-%d" % (w, i), VALUE)
            i += 1
            done += 1

    tasks = [asyncio.create_task(worker(w)) for w in range(clients)]
    await asyncio.sleep(0.5)  # warm up
    start_done, start = done, time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (done - start_done) / (time.perf_counter() - start)
    stop = True
    await asyncio.gather(*tasks)
    return {"clients": clients, "seconds": seconds, "ops_per_s": round(rate)}


async def _sequential(cluster: LocalCluster, ops: int) -> dict[str, Any]:
    client = cluster.client(timeout=10)
    await cluster.wait_leader(client)
    lat = []
    for i in range(ops):
        t = time.perf_counter()
        await client.put(b"s%d" % i, VALUE)
        lat.append(time.perf_counter() - t)
    return {"ops": ops, "ops_per_s": round(ops / sum(lat)), "p50_ms": round(_pct(lat, 0.5) * 1e3, 3),
            "p99_ms": round(_pct(lat, 0.99) * 1e3, 3)}


async def _failover(cluster: LocalCluster, kills: int) -> dict[str, Any]:
    client = cluster.client(timeout=10, attempt_timeout=0.3)
    times = [await _one_failover(cluster, client, k) for k in range(kills)]
    return {"kills": kills, "median_ms": round(statistics.median(times) * 1e3, 1),
            "max_ms": round(max(times) * 1e3, 1), "all_ms": [round(t * 1e3, 1) for t in times]}


async def _one_failover(cluster: LocalCluster, client: KVClient, k: int) -> float:
    """Seconds from kill -9 of the leader to the first acknowledged write issued after it."""
    lead = await cluster.wait_leader(client)
    acks: list[tuple[float, float]] = []  # (issued, acknowledged)
    stop = False

    async def writer(w: int) -> None:
        i = 0
        while not stop:
            issued = time.perf_counter()
            await client.put(b"f%d-%d-%d" % (k, w, i), VALUE)
            acks.append((issued, time.perf_counter()))
            i += 1

    tasks = [asyncio.create_task(writer(w)) for w in range(4)]
    await eventually(lambda: (len(acks) > 50), 10, "writes before the kill")
    killed = time.perf_counter()
    cluster.kill(lead)
    await eventually(lambda: (any(t0 > killed for t0, _ in acks)), 15, "a write after the kill")
    stop = True
    await asyncio.gather(*tasks)
    cluster.start(lead)
    await cluster.wait_converged(client, list(cluster.initial), timeout=30)
    return min(t1 for t0, t1 in acks if t0 > killed) - killed


async def _catch_up(cluster: LocalCluster, mutations: int) -> dict[str, Any]:
    client = cluster.client(timeout=20)
    lead = await cluster.wait_leader(client)
    for i in range(0, mutations, 2000):
        await asyncio.gather(*(client.put(b"c%d" % j, VALUE) for j in range(i, min(i + 2000, mutations))))
    before = await client.status(lead)
    target = before["commit"]
    victim = next(i for i in cluster.initial if i != lead)
    cluster.kill(victim)
    cluster.wipe(victim)
    started = time.perf_counter()
    cluster.start(victim)
    up: list[float] = []

    async def caught_up() -> bool:
        st = await client.try_status(victim)
        if st and not up:
            up.append(time.perf_counter())
        return bool(st and st["applied"] >= target)

    await eventually(caught_up, 120, "the wiped node to catch up", every=0.005)
    done = time.perf_counter()
    st = await client.status(victim)
    sums = await cluster.wait_converged(client, list(cluster.initial), timeout=30)
    return {"mutations": mutations, "log_index": target, "snapshot_index": st["snapshot_index"],
            "leader_term": before["term"],
            "from_process_start_ms": round((done - started) * 1e3, 1),
            "from_node_up_ms": round((done - up[0]) * 1e3, 1),
            "checksums_equal": len({c["checksum"] for c in sums.values()}) == 1}


def bench_raft(args: argparse.Namespace, knobs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), 3, **knobs)
        try:
            cluster.start_all()

            async def run() -> None:
                out["concurrent"] = await _throughput(cluster, args.clients, args.seconds)
                out["sequential"] = await _sequential(cluster, args.seq_ops)
                out["failover"] = await _failover(cluster, args.kills)
                out["catch_up"] = await _catch_up(cluster, args.catchup)
                await cluster.close_clients()

            _loop_runner()(run())
        finally:
            cluster.close()
    return out


def _loop_runner() -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


# ------------------------------------------------------------------------ clustermgr
async def _leader(c: ClusterClient, cms: list[Service]) -> Service:
    while (leader := (await c.raft_status()).leader) is None:
        await asyncio.sleep(0.05)
    return cms[leader - 1]


async def _paused_leader(cms: list[Service], pauses: int, seconds: float, clients: int) -> dict[str, Any]:
    writers = [ClusterClient([cm.url for cm in cms]) for _ in range(clients)]
    try:
        stalls = [await _one_pause(cms, writers, k, seconds) for k in range(pauses)]
    finally:
        for c in writers:
            await c.close()
    return {"pauses": pauses, "pause_s": seconds, "writers": clients,
            "median_ms": round(statistics.median(stalls) * 1e3, 1), "max_ms": round(max(stalls) * 1e3, 1),
            "all_ms": [round(t * 1e3, 1) for t in stalls]}


async def _one_pause(cms: list[Service], writers: list[ClusterClient], k: int, seconds: float) -> float:
    """The longest wait of any write in flight while the leader was stopped (SIGSTOP) for `seconds`."""
    leader = await _leader(writers[0], cms)
    waits: list[tuple[float, float]] = []  # (issued, acknowledged)
    stop = asyncio.Event()

    async def writer(c: ClusterClient, w: int) -> None:
        i = 0
        while not stop.is_set():
            issued = time.perf_counter()
            await c.kv_set(f"pause{k}/{w}/{i}", "x")
            waits.append((issued, time.perf_counter()))
            i += 1

    tasks = [asyncio.create_task(writer(c, w)) for w, c in enumerate(writers)]
    await asyncio.sleep(0.5)
    os.kill(leader.pid, signal.SIGSTOP)
    paused = time.perf_counter()
    await asyncio.sleep(seconds)
    os.kill(leader.pid, signal.SIGCONT)
    resumed = time.perf_counter()
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*tasks)
    return max(t1 - t0 for t0, t1 in waits if t1 > paused and t0 < resumed)


def _cpu_seconds(services: list[Service]) -> float:
    """User + system CPU the processes have used."""
    return sum(cpu_seconds(service.pid) for service in services)


async def _session_cost(cms: list[Service], clients: int, seconds: float, rounds: int) -> dict[str, Any]:
    """kv writes/s from one client with `clients` concurrent calls, sessions off and on in turns (the
    order alternating by round), over a fixed set of keys so that the state does not grow meanwhile;
    with the CPU the three replicas spent per commit, which other jobs on the box disturb less."""
    urls = [cm.url for cm in cms]
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    async with ClusterClient(urls, sessions=False) as off, ClusterClient(urls) as on:
        for r in range(rounds):
            for mode, c in ((("off", off), ("on", on)) if r % 2 == 0 else (("on", on), ("off", off))):
                commits = 0

                async def put(w: int, i: int, c: ClusterClient = c) -> int:
                    nonlocal commits
                    await c.kv_set(f"s/{w}/{i % 50}", "v" * 32)
                    commits += 1
                    return 1

                used = _cpu_seconds(cms)
                rates[mode].append(await rate(clients, seconds, put))
                cpu[mode].append(round((_cpu_seconds(cms) - used) / commits * 1e3, 3))
    paired = [on_rate / off_rate for on_rate, off_rate in zip(rates["on"], rates["off"], strict=True)]
    return {"clients": clients, "seconds": seconds, "rounds": rounds,
            "off_per_s": statistics.median(rates["off"]), "on_per_s": statistics.median(rates["on"]),
            "on_vs_off": round(statistics.median(paired), 3),
            "cpu_ms_per_commit": {"off": statistics.median(cpu["off"]), "on": statistics.median(cpu["on"])},
            "all": {"per_s": rates, "cpu_ms_per_commit": cpu}}


def bench_clustermgr(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-raft-cm-") as tmp:
        cms = start_clustermgr(Path(tmp), volumes=0)
        try:
            for cm in cms:
                cm.start()

            async def run() -> None:
                if "sessions" in args.sections:
                    out["sessions"] = await _session_cost(cms, args.cm_clients, args.seconds, args.rounds)
                if "paused" in args.sections:
                    out["paused_leader"] = await _paused_leader(cms, args.pauses, args.pause_seconds, 4)

            _loop_runner()(run())
        finally:
            stop_all(cms)
    return out


# ------------------------------------------------------------------------- PySyncObj
def pysyncobj_node(args: argparse.Namespace) -> None:
    """One PySyncObj process; the one that becomes leader runs the workload and writes `out`."""
    from pysyncobj import SyncObj, SyncObjConf, replicated

    class KV(SyncObj):  # type: ignore[misc]
        def __init__(self, me: str, others: list[str], conf: SyncObjConf) -> None:
            super().__init__(me, others, conf)
            self.d: dict[bytes, bytes] = {}

        @replicated  # type: ignore[misc]
        def put(self, key: bytes, value: bytes) -> None:
            self.d[key] = value

    addrs = args.pso_addrs.split(",")
    me = addrs[args.pso_node]
    conf = SyncObjConf(appendEntriesUseBatch=args.pso_mode != "sequential", dynamicMembershipChange=False)
    kv = KV(me, [a for a in addrs if a != me], conf)
    out = Path(args.pso_out)
    while not out.exists():
        if kv._isLeader() and kv._isReady():
            result = _pso_sequential(kv, args.seq_ops) if args.pso_mode == "sequential" \
                else _pso_concurrent(kv, args.seconds)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            os.replace(tmp, out)
            break
        time.sleep(0.05)
    time.sleep(3600)


def _pso_concurrent(kv: Any, seconds: float, window: int = 5000) -> dict[str, Any]:
    """Keep up to `window` puts outstanding; the callbacks run on PySyncObj's own thread."""
    done = [0]

    def cb(result: Any, err: Any) -> None:
        done[0] += err == 0

    issued = 0

    def run_for(duration: float) -> None:
        nonlocal issued
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            if issued - done[0] < window:
                for _ in range(100):
                    kv.put(b"t%d" % issued, VALUE, callback=cb)
                    issued += 1
            else:
                time.sleep(0.0005)

    run_for(0.5)  # warm up
    start_done, start = done[0], time.perf_counter()
    run_for(seconds)
    rate = (done[0] - start_done) / (time.perf_counter() - start)
    return {"window": window, "seconds": seconds, "ops_per_s": round(rate)}


def _pso_sequential(kv: Any, ops: int) -> dict[str, Any]:
    lat = []
    for i in range(ops):
        t = time.perf_counter()
        kv.put(b"s%d" % i, VALUE, sync=True)
        lat.append(time.perf_counter() - t)
    return {"ops": ops, "ops_per_s": round(ops / sum(lat)), "p50_ms": round(_pct(lat, 0.5) * 1e3, 3),
            "p99_ms": round(_pct(lat, 0.99) * 1e3, 3)}


def bench_pysyncobj(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        addrs = ",".join(f"127.0.0.1:{free_port()}" for _ in range(3))
        logs = [open(Path(tmp) / f"pso{i}.log", "wb") for i in range(3)]  # noqa: SIM115
        procs = [subprocess.Popen([sys.executable, "-m", "bench.raft", "--pso-node", str(i), "--pso-addrs", addrs,
                                   "--pso-out", str(out), "--pso-mode", mode, "--seconds", str(args.seconds),
                                   "--seq-ops", str(args.seq_ops)], cwd=ROOT, stdout=logs[i], stderr=logs[i])
                 for i in range(3)]
        try:
            deadline = time.monotonic() + 120
            while not out.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("PySyncObj produced no result")
                time.sleep(0.1)
            result = dict(json.loads(out.read_text()))
        finally:
            for p in procs:
                p.send_signal(signal.SIGKILL)
                p.wait()
            for f in logs:
                f.close()
        # its own warning about a known bug: followers truncating applied entries
        text = "".join((Path(tmp) / f"pso{i}.log").read_text(errors="replace") for i in range(3))
        result["warnings_truncating_applied_entries"] = text.count("truncating already-applied")
        return result


# ------------------------------------------------------------------------------ main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--clients", type=int, default=256, help="concurrent clients of the throughput run")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--seq-ops", type=int, default=2000)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--catchup", type=int, default=150_000, help="mutations the wiped node must learn")
    p.add_argument("--pauses", type=int, default=5, help="SIGSTOPs of the clustermgr leader")
    p.add_argument("--pause-seconds", type=float, default=5.0)
    p.add_argument("--cm-clients", type=int, default=64, help="concurrent calls of the sessions on/off run")
    p.add_argument("--rounds", type=int, default=8, help="sessions off/on rounds")
    p.add_argument("--heartbeat-ms", type=float, default=20.0)
    p.add_argument("--election-ms", type=float, nargs=2, default=(100.0, 200.0))
    p.add_argument("--max-batch", type=int, default=1024)
    p.add_argument("--no-fsync", action="store_true")
    p.add_argument("--pso-node", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pso-addrs", help=argparse.SUPPRESS)
    p.add_argument("--pso-out", help=argparse.SUPPRESS)
    p.add_argument("--pso-mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.pso_node is not None:
        pysyncobj_node(args)
        return
    knobs = {"heartbeat_ms": args.heartbeat_ms, "election_ms": list(args.election_ms), "max_batch": args.max_batch,
             "fsync": not args.no_fsync, "tick_ms": 10.0, "snapshot_threshold": 20000, "snapshot_keep": 5000}
    result: dict[str, Any] = {"knobs": knobs, "cpus": os.cpu_count()}
    if "raft" in args.sections:
        result["raft"] = bench_raft(args, knobs)
    if "pysyncobj" in args.sections:
        result["pysyncobj"] = {
            "version": "0.3.17", "fsync": False, "driven_in_leader_process": True,
            "concurrent": bench_pysyncobj(args, "concurrent"),
            "sequential_batching_off": bench_pysyncobj(args, "sequential"),
        }
    if {"paused", "sessions"} & set(args.sections):
        result["clustermgr"] = bench_clustermgr(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(summary(result, args))


def summary(result: dict[str, Any], args: argparse.Namespace) -> str:
    parts = []
    if "raft" in result:
        r = result["raft"]
        parts.append(f"raft fsync={result['knobs']['fsync']}: {r['concurrent']['ops_per_s']} ops/s x{args.clients}"
                     f" clients, 1 client {r['sequential']['ops_per_s']} ops/s p50 {r['sequential']['p50_ms']} ms"
                     f" p99 {r['sequential']['p99_ms']} ms, failover median {r['failover']['median_ms']} ms"
                     f" max {r['failover']['max_ms']} ms, catch-up of {r['catch_up']['mutations']} in"
                     f" {r['catch_up']['from_node_up_ms']} ms")
    if "pysyncobj" in result:
        pso = result["pysyncobj"]
        parts.append(f"pysyncobj (no fsync): {pso['concurrent']['ops_per_s']} ops/s, 1 client"
                     f" {pso['sequential_batching_off']['ops_per_s']} ops/s"
                     f" p50 {pso['sequential_batching_off']['p50_ms']} ms")
    cm = result.get("clustermgr", {})
    if "paused_leader" in cm:
        p = cm["paused_leader"]
        parts.append(f"clustermgr write stall under a {p['pause_s']} s paused leader: median {p['median_ms']} ms"
                     f" max {p['max_ms']} ms over {p['pauses']} pauses")
    if "sessions" in cm:
        s = cm["sessions"]
        cpu = s["cpu_ms_per_commit"]
        parts.append(f"kv writes/s sessions on {s['on_per_s']:.0f} vs off {s['off_per_s']:.0f}"
                     f" ({s['on_vs_off']}x paired by round), replicas' CPU {cpu['on']} vs {cpu['off']} ms/commit")
    return " | ".join(parts)


if __name__ == "__main__":
    main()
