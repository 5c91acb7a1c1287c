"""Worker shard repair against real blobnodes: lost, corrupt and deleted shards."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable

import httpx
import pytest

from blobstore_server.libs import cpugroup
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc import errors
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.worker.client import WorkerClient
from tests.support.damage import flip_in_chunk, locate, lose_shard
from tests.support.load import wait_for_put
from tests.support.processes import LocalCluster, Service, free_port
from tests.support.tickets import as_tinker

ClusterFactory = Callable[..., LocalCluster]


def start_worker(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Service:
    workdir = tmp_path_factory.mktemp("worker")
    port = free_port()
    config = {"bind_addr": f"127.0.0.1:{port}", "clustermgr_hosts": [cm.url for cm in cluster.clustermgr]}
    return Service("worker", config, workdir, f"http://127.0.0.1:{port}").start()


def test_repair_rebuilds_lost_and_corrupt_shards_and_never_resurrects(
        cluster_factory: ClusterFactory, tmp_path_factory: pytest.TempPathFactory) -> None:
    cluster = cluster_factory()
    worker = start_worker(cluster, tmp_path_factory)
    data = random.Random(21).randbytes(123_456)
    try:
        with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
            token = wait_for_put(client, data)
            other = wait_for_put(client, b"another blob")
        vid, bid = next(Location.from_token(token, cluster.secret.encode()).blob_ids())
        other_vid, other_bid = next(Location.from_token(other, cluster.secret.encode()).blob_ids())

        async def scenario() -> None:
            async with (ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn,
                        WorkerClient() as w):
                units = (await cm.get_volume(vid)).units
                originals = [await bn.get_shard(u.host, u.disk_id, u.vuid, bid) for u in units]
                # Shard 0 lost, shard 4 silently missing (not reported), shard 2 rotten (the worker discards it: its
                # blobnode sees it fail its checksums).
                for i in (0, 4):
                    await lose_shard(bn, units[i], bid)
                flip_in_chunk(*await locate(bn, units[2], bid))
                answer = await w.repair_shards(worker.url, vid, bid, [0, 2])
                assert sorted(answer.repaired) == [0, 2, 4]
                # rebuilt in an idle cpu cgroup where the box lets it make one (as root with cgroupfs, as in CI)
                group = cpugroup.idle_group_beside()
                assert cpugroup.idle_group_of(worker.pid) or group is None or not os.access(group.parent, os.W_OK)
                for i, u in enumerate(units):
                    assert await bn.get_shard(u.host, u.disk_id, u.vuid, bid) == originals[i]
                assert (await w.repair_shards(worker.url, vid, bid, [1])).repaired == [1]  # idempotent

                # A blob being deleted (mark-deleted shards) is left alone.
                other_units = (await cm.get_volume(other_vid)).units
                for u in other_units[1:]:
                    await bn.mark_delete_shard(u.host, u.disk_id, u.vuid, other_bid,
                                               **as_tinker(u.host, u.disk_id, u.vuid, other_bid))
                first = other_units[0]
                await lose_shard(bn, first, other_bid)
                skipped = await w.repair_shards(worker.url, other_vid, other_bid, [0])
                assert skipped.skipped and skipped.repaired == []
                with pytest.raises(errors.ShardNotFound):
                    await bn.shard_stat(first.host, first.disk_id, first.vuid, other_bid)

                # Too few survivors: a clear failure, nothing written.
                for u in units[:4]:
                    await lose_shard(bn, u, bid)
                with pytest.raises(errors.Unavailable, match="need 3"):
                    await w.repair_shards(worker.url, vid, bid, [0, 1, 2, 3])
                stats = await w.stats(worker.url)
                assert stats.repaired_shards == 4 and stats.skipped == 1 and stats.failed == 1
                services = await cm.list_services("worker")
                assert [s.host for s in services] == [worker.url]

        asyncio.run(scenario())
    finally:
        worker.stop()
