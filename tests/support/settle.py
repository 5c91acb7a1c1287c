"""How every partition scenario ends: each acknowledged object reads back byte for byte, every shard of it is
present once repair settles, and the clustermgr replicas hold the same state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from blobstore import AsyncClient
from blobstore.launcher import ClusterInfo
from blobstore.shards import ShardReport, inspect_shards
from libs.proto.blobnode import ShardState
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from tests.support.load import read_back

PARALLEL = 8  # objects inspected at a time


async def not_present(info: ClusterInfo, tokens: Iterable[str]) -> dict[str, list[ShardReport]]:
    """Objects with a shard that is not present and intact, with those shards."""
    gate = asyncio.Semaphore(PARALLEL)
    async with AsyncClient(info.access_urls) as client, ClusterClient(info.clustermgr_urls) as cm, \
            BlobnodeClient() as blobnodes:
        async def shards(token: str) -> tuple[str, list[ShardReport]]:
            async with gate:
                reports = await inspect_shards(await client.stat(token), cm, blobnodes)
            return token, [r for r in reports if r.state != ShardState.PRESENT]

        found = await asyncio.gather(*(shards(t) for t in tokens))
    return {token: bad for token, bad in found if bad}


def wait_all_shards_present(info: ClusterInfo, tokens: Iterable[str], timeout: float) -> None:
    """Until every shard of `tokens` is present (repair done), looking again only at what was missing."""
    left = list(tokens)
    deadline = time.monotonic() + timeout
    while True:
        bad = asyncio.run(not_present(info, left))
        if not bad:
            return
        if time.monotonic() > deadline:
            sample = [(r.vid, r.bid, r.index, r.host, r.state) for reports in list(bad.values())[:3] for r in reports]
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
    assert read_back(info.access_urls, acked) == []
    read = time.monotonic()
    wait_all_shards_present(info, acked, repair_timeout)
    present = time.monotonic()
    wait_replicas_agree(info)
    print(f"settled: {len(acked)} objects read back in {read - started:.1f} s, every shard present after "
          f"{present - read:.1f} s, replicas level after {time.monotonic() - present:.1f} s")
