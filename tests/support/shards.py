"""What a test cluster holds of an object: its blobs, and the state of each of their shards."""

from __future__ import annotations

import asyncio

from blobstore import AsyncClient
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc import errors
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.processes import LocalCluster


def blobs_of(cluster: LocalCluster, token: str) -> list[tuple[int, int]]:
    return list(Location.from_token(token, cluster.secret.encode()).blob_ids())


async def shard_states(cluster: LocalCluster, vid: int, bid: int) -> list[str]:
    """present / mark_deleted / missing / unreachable for every unit of the blob."""
    async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
        states = []
        for unit in (await cm.get_volume(vid)).units:
            try:
                info = await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)
                states.append("present" if info.status == "normal" else info.status)
            except errors.NotFound:
                states.append("missing")
            except errors.Unavailable:
                states.append("unreachable")
        return states


def states(cluster: LocalCluster, vid: int, bid: int) -> list[str]:
    return asyncio.run(shard_states(cluster, vid, bid))


async def assert_every_shard_present(cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    """Every object reads back, and every shard of each of its blobs is on its unit, normal."""
    async with AsyncClient([cluster.access[0].url], timeout=60) as client:
        for location, data in objects.items():
            assert await client.get(location) == data
            for vid, bid in blobs_of(cluster, location):
                states = await shard_states(cluster, vid, bid)
                assert states == ["present"] * len(states), (vid, bid, states)
