"""A volume's unit is switched to a move's destination only once that destination holds what the unit owes (issue
65: the scheduler's key alone once pointed a unit at a chunk it created and left empty), on real processes: the
scheduler's keys get 409 for an empty destination and for lost claims of blobs clustermgr reads back whole; a claim
of a blob it finds too few good shards of lets the move through, as the worker's report of a LOST blob does."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

import pytest

from blobstore import AsyncClient
from blobstore_server.cluster.service_auth import role_auth
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc import errors
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.damage import flip_in_chunk, locate
from tests.support.metrics import sample
from tests.support.processes import TEST_SECRET, signing_with
from tests.support.tickets import hmac_keys


def test_a_switch_to_a_destination_short_of_the_units_blobs_is_refused(cluster_factory: Any) -> None:
    cluster = cluster_factory(blobnodes=7, min_volumes=1)
    urls = [cm.url for cm in cluster.clustermgr]
    scheduler = hmac_keys(role_auth(TEST_SECRET, "scheduler", {"bind_addr": "127.0.0.1:2"}))  # a leaked conf.json

    async def scenario() -> None:
        async with AsyncClient([cluster.access[0].url], timeout=60) as client:
            stored = {}
            for _ in range(12):
                data = os.urandom(30_000)
                stored[await client.put(data)] = data
        blob_of = {token: next(Location.from_token(token, cluster.secret.encode()).blob_ids()) for token in stored}
        vid = Counter(v for v, _ in blob_of.values()).most_common(1)[0][0]
        mine = sorted(b for v, b in blob_of.values() if v == vid)
        assert len(mine) >= 2
        async with ClusterClient(urls) as cm, BlobnodeClient() as bn:
            volume = await cm.get_volume(vid)
            source = volume.units[0]
            bids = sorted(await bn.list_all_shards(source.host, source.disk_id, source.vuid))
            assert set(mine) <= set(bids)
            with signing_with(scheduler):
                await cm.lock_volume(vid)
                empty = await cm.alloc_unit(vid, 0)
                await bn.create_chunk(empty.host, empty.disk_id, empty.vuid)
                with pytest.raises(errors.Conflict, match=f"lacks {len(bids)} blobs"):
                    await cm.update_unit(vid, 0, empty.vuid, empty.disk_id)
                # every blob claimed lost: clustermgr reads each back from the other units, whole
                with pytest.raises(errors.Conflict, match=f"lacks {len(bids)} blobs"):
                    await cm.update_unit(vid, 0, empty.vuid, empty.disk_id, lost=bids)
            assert (await cm.get_volume(vid)).units[0] == source

            # One blob made unrebuildable: its shards rot on four of the six units (two good left, N = 3)
            lost = mine[-1]
            for unit in volume.units[1:5]:
                flip_in_chunk(*await locate(bn, unit, lost))
            # the destination given every other shard, as a worker would
            for bid in bids:
                if bid != lost:
                    shard = await bn.get_shard(source.host, source.disk_id, source.vuid, bid)
                    await bn.put_shard(empty.host, empty.disk_id, empty.vuid, bid, shard)
            with signing_with(scheduler):
                with pytest.raises(errors.Conflict, match=rf"lacks 1 blobs the unit holds \(first bids \[{lost}\]\)"):
                    await cm.update_unit(vid, 0, empty.vuid, empty.disk_id)
                moved = await cm.update_unit(vid, 0, empty.vuid, empty.disk_id, lost=[lost])
                await cm.unlock_volume(vid)
            assert moved.units[0].vuid == empty.vuid
        assert sum(sample(url, "blobstore_clustermgr_moves_refused_total") for url in urls) == 3
        async with AsyncClient([cluster.access[0].url], timeout=60) as client:
            for token, data in stored.items():
                if blob_of[token] != (vid, lost):
                    assert await client.get(token) == data

    asyncio.run(scenario())
