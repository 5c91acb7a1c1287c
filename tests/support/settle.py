"""How every partition scenario ends: each acknowledged object reads back byte for byte, every shard of it is
present once repair settles, and the clustermgr replicas hold the same state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from blobstore import AsyncClient
from blobstore.records import Stat
from blobstore_server.cluster.launcher import ClusterInfo
from blobstore_server.libs.proto.blobnode import ShardInfo
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.load import read_back

PARALLEL = 16  # requests in flight


async def not_present(info: ClusterInfo, tokens: Iterable[str]) -> dict[str, list[str]]:
    """Objects with a shard not listed as normal on its volume's current unit, with those shards. Each unit's
    shard list is read once (a stat per shard of a thousand objects took 20-50 s); the read-back checked the
    bytes already."""
    gate = asyncio.Semaphore(PARALLEL)
    async with AsyncClient(info.access_urls, ca=info.ca) as client, ClusterClient(info.clustermgr_urls) as cm, \
            BlobnodeClient() as blobnodes:
        async def stat(token: str) -> tuple[str, Stat]:
            async with gate:
                return token, await client.stat(token)

        async def listing(unit: Unit) -> dict[int, ShardInfo]:
            async with gate:
                try:
                    return await blobnodes.list_all_shards(unit.host, unit.disk_id, unit.vuid)
                except RpcError:
                    return {}

        stats = dict(await asyncio.gather(*(stat(t) for t in tokens)))
        vids = sorted({s.vid for found in stats.values() for s in found.blobs})
        volumes = {vid: await cm.get_volume(vid) for vid in vids}
        units = [(vid, index, unit) for vid in vids for index, unit in enumerate(volumes[vid].units)]
        listed = dict(zip([(vid, index) for vid, index, _ in units],
                          await asyncio.gather(*(listing(unit) for _, _, unit in units)), strict=True))
    bad = {}
    for token, found in stats.items():
        missing = [f"{s.vid}/{bid} unit {index} on {unit.host}"
                   for s in found.blobs for bid in range(s.min_bid, s.min_bid + s.count)
                   for index, unit in enumerate(volumes[s.vid].units)
                   if (shard := listed[s.vid, index].get(bid)) is None or shard.status != "normal"]
        if missing:
            bad[token] = missing
    return bad


def wait_all_shards_present(info: ClusterInfo, tokens: Iterable[str], timeout: float) -> None:
    """Until every shard of `tokens` is present (repair done), looking again only at what was missing."""
    left = list(tokens)
    deadline = time.monotonic() + timeout
    while True:
        bad = asyncio.run(not_present(info, left))
        if not bad:
            return
        if time.monotonic() > deadline:
            sample = [shard for shards in list(bad.values())[:3] for shard in shards]
            raise AssertionError(f"{len(bad)} object(s) still miss shards after {timeout} s, e.g. {sample}")
        left = list(bad)
        time.sleep(2.0)


async def _replicas_agree(info: ClusterInfo) -> bool:
    """Every replica stands at the same applied index with the same checksum (heartbeats keep applying, so the
    caller asks again until one look catches them level)."""
    async with ClusterClient(info.clustermgr_urls) as cm:
        statuses = await asyncio.gather(*(cm.raft_status(url) for url in info.clustermgr_urls))
    return len({(s.applied_index, s.checksum) for s in statuses}) == 1


def wait_replicas_agree(info: ClusterInfo, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not asyncio.run(_replicas_agree(info)):
        assert time.monotonic() < deadline, f"clustermgr replicas never stood level within {timeout} s"
        time.sleep(0.05)


def settled(info: ClusterInfo, acked: dict[str, bytes], repair_timeout: float = 120.0) -> None:
    """The end of every scenario, once the network is whole again."""
    started = time.monotonic()
    assert read_back(info.access_urls, acked, ca=info.ca) == []
    read = time.monotonic()
    wait_all_shards_present(info, acked, repair_timeout)
    present = time.monotonic()
    wait_replicas_agree(info)
    print(f"settled: {len(acked)} objects read back in {read - started:.1f} s, every shard present after "
          f"{present - read:.1f} s, replicas level after {time.monotonic() - present:.1f} s")
