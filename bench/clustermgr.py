"""clustermgr request rates through its HTTP API (3 replicas, fsync on), next to the raw libs/raft
commit rate of the replicated kv measured in the same run: the gap is the service's own overhead
(HTTP, JSON, pydantic, the state machine's RocksDB writes).

Ops: volume lease (alloc one volume, then release it: two commits per cycle, counted as two),
scope alloc (bid ranges), disk heartbeat (six disks per request, as a blobnode sends). Writes JSON
and prints one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blobstore_server.libs.ec import CodeMode  # noqa: E402
from blobstore_server.libs.proto.clustermgr import DiskBeat  # noqa: E402
from blobstore_server.libs.rpc import auth  # noqa: E402
from blobstore_server.libs.rpc.auth import operator_signer  # noqa: E402
from blobstore_server.services.clustermgr.client import ClusterClient  # noqa: E402
from tests.support.processes import TEST_SECRET, Service, free_port, stop_all  # noqa: E402
from tests.support.raftkv.kvcluster import LocalCluster  # noqa: E402


async def rate(clients: int, seconds: float, op: Callable[[int, int], Awaitable[int]]) -> float:
    """Commits per second with `clients` concurrent loops after a 0.5 s warm-up (connections, the
    first leader round trips); `op(worker, i)` returns the commits it made."""
    done = 0
    stop = False

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while not stop:
            commits = await op(w, i)  # not `done += await ...`: that reads `done` before the await
            done += commits
            i += 1

    tasks = [asyncio.create_task(worker(w)) for w in range(clients)]
    await asyncio.sleep(0.5)
    start_done, start = done, time.perf_counter()
    await asyncio.sleep(seconds)
    result = (done - start_done) / (time.perf_counter() - start)
    stop = True
    await asyncio.gather(*tasks)
    return round(result, 1)


async def raw_raft(base: Path, clients: int, seconds: float) -> float:
    cluster = LocalCluster(base, 3)
    cluster.start_all()
    try:
        client = cluster.client(timeout=10)
        await cluster.wait_leader(client)

        async def put(w: int, i: int) -> int:
            await client.put(b"k%d-%d" % (w, i), b"v" * 64)
            return 1

        return await rate(clients, seconds, put)
    finally:
        await cluster.close_clients()
        cluster.close()


def start_clustermgr(base: Path, volumes: int) -> list[Service]:
    members = {str(i): {"raft_addr": f"127.0.0.1:{free_port()}", "http_addr": f"127.0.0.1:{free_port()}"}
               for i in (1, 2, 3)}
    services = []
    for i in (1, 2, 3):
        workdir = base / f"cm{i}"
        workdir.mkdir(parents=True)
        config = {"node_id": i, "members": members, "data_dir": str(workdir / "data"), "chunk_size": 64 << 20,
                  "volume_check_interval": 0.2, "code_modes": [{"code_mode": "EC3P3", "min_volumes": volumes}],
                  "disk_heartbeat_batch": 0}  # each heartbeat its own commit: the commit path is what is measured
        services.append(Service("clustermgr", config, workdir, f"http://{members[str(i)]['http_addr']}"))
    return services


def start_blobnodes(base: Path, cms: list[Service]) -> list[Service]:
    nodes = []
    for i in range(6):
        workdir = base / f"bn{i}"
        workdir.mkdir(parents=True)
        port = free_port()
        config = {"bind_addr": f"127.0.0.1:{port}", "disks": [{"path": str(workdir / "disk")}],
                  "clustermgr_hosts": [cm.url for cm in cms], "heartbeat_interval": 1.0}
        nodes.append(Service("blobnode", config, workdir, f"http://127.0.0.1:{port}"))
    return nodes


async def service_rates(cms: list[Service], clients: int, seconds: float) -> dict[str, float]:
    async with ClusterClient([cm.url for cm in cms]) as c:
        while len(await c.list_volumes()) < clients:
            await asyncio.sleep(0.2)
        disks = [DiskBeat(disk_id=d.disk_id, size=d.size, free=d.free) for d in await c.list_disks()]
        mode = CodeMode.EC3P3

        async def lease(w: int, i: int) -> int:
            holder = f"bench-{w}"
            leased = (await c.alloc_volumes(mode, holder, 1)).volumes
            for volume in leased:
                await c.release_volume(volume.vid, holder)
            return 1 + len(leased)

        async def scope(w: int, i: int) -> int:
            await c.alloc_scope("bid", 1000)
            return 1

        async def heartbeat(w: int, i: int) -> int:
            await c.disk_heartbeat(disks)
            return 1

        return {"volume_lease": await rate(clients, seconds, lease),
                "scope_alloc": await rate(clients, seconds, scope),
                "disk_heartbeat": await rate(clients, seconds, heartbeat)}


def main() -> None:
    auth.install(operator_signer(TEST_SECRET))  # the services run with the test fixtures' keys, as deployed
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default="bench/results/clustermgr.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cm-") as tmp:
        base = Path(tmp)
        raw = asyncio.run(raw_raft(base / "raft", args.clients, args.seconds))
        cms = start_clustermgr(base, volumes=args.clients)
        nodes: list[Service] = []
        try:
            for cm in cms:
                cm.start()
            nodes = start_blobnodes(base, cms)
            for node in nodes:
                node.start()
            rates = asyncio.run(service_rates(cms, args.clients, args.seconds))
        finally:
            stop_all(nodes + cms)
    result = {"clients": args.clients, "seconds": args.seconds, "raw_raft_commits_per_s": raw,
              "clustermgr_per_s": rates, "ratio_vs_raw": {k: round(v / raw, 3) for k, v in rates.items()}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"clustermgr (3 nodes, fsync, {args.clients} clients): " +
          ", ".join(f"{k} {v:.0f}/s ({result['ratio_vs_raw'][k]}x raw)" for k, v in rates.items()) +
          f"; raw libs/raft kv {raw:.0f} commits/s")


if __name__ == "__main__":
    main()
