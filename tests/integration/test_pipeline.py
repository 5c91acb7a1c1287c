"""Kafka-driven repair and delete, end to end: real broker, mqproxy, tinker, worker, access, blobnodes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from libs.proto.location import Location
from libs.rpc import errors
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from tests.integration.test_access import wait_for_put
from tests.support.processes import LocalCluster, wait_until

ClusterFactory = Callable[..., LocalCluster]


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


def chunk_blocks(cluster: LocalCluster) -> int:
    return sum(os.stat(p).st_blocks for node in cluster.blobnodes for p in node.workdir.glob("disk*/data/*"))


def tinker_stats(cluster: LocalCluster) -> dict[str, Any]:
    return dict(httpx.get(f"{cluster.background['tinker'].url}/stats", timeout=30).json())


def test_delete_hides_at_once_and_reclaims_space_after_the_safe_delay(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=3.0)
    data = random.Random(1).randbytes(3 << 20)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, data)
        (vid, bid), = blobs_of(cluster, token)
        blocks_before = chunk_blocks(cluster)
        deleted_at = time.monotonic()
        resp = client.delete(f"/blob/{token}")
        assert resp.status_code == 202 and resp.json() == {"queued_blobs": 1}
        wait_until(lambda: client.get(f"/blob/{token}").status_code == 404, 10, "GET to answer 404")
        assert time.monotonic() - deleted_at < 3.0  # hidden well before the safe delay ends
        assert states(cluster, vid, bid) == ["mark_deleted"] * 6
        wait_until(lambda: states(cluster, vid, bid) == ["missing"] * 6, 20, "every shard purged")
        assert chunk_blocks(cluster) < blocks_before - (3 << 20) // 512
        assert client.delete(f"/blob/{token}").status_code == 202  # harmless the second time
        assert client.get(f"/blob/{token}").status_code == 404
    log = Path(cluster.background["tinker"].config["delete_log"]).read_text().splitlines()
    assert {(e["vid"], e["bid"]) for e in map(json.loads, log)} == {(vid, bid)}
