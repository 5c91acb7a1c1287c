"""The migrate engine against real processes: copy, resume, rebuild from the other units when the source's
blobnode is gone, and a destination that dies mid-run."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from blobstore_server.libs.proto.blobnode import ShardInfo
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.proto.scheduler import TaskProgress, TaskRef, WorkTask
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.worker.config import WorkerConfig
from blobstore_server.services.worker.migrate import DestinationFailed, UnitMigrator
from tests.support.damage import lose_shard
from tests.support.load import wait_for_put
from tests.support.processes import TEST_SECRET, LocalCluster, Service
from tests.support.tickets import as_tinker, epoch_ticket, minter

ClusterFactory = Callable[..., LocalCluster]
TOKEN = 1  # of the test's hand-outs
SIZES = [1, 700, 5_000, 33_000, 100_000, 250_000, 700_000, 1_500_000] * 3


class Interrupted(Exception):
    """Raised from the report callback: the run stops there, as when a worker dies or loses its lease."""


def work_task(vid: int, index: int, source: Unit, destination: Unit, readable: bool = True) -> WorkTask:
    """The task as the scheduler hands it out: under token TOKEN (the destination's fence open at it, see
    `new_destination`), with its discard ticket for the destination."""
    ref = TaskRef(task_type=TaskType.DISK_REPAIR, task_id=f"{vid}-{index}", worker="test",
                  source_vuid=source.vuid, destination_vuid=destination.vuid, epoch=1, token=TOKEN)
    ticket = minter(TEST_SECRET, Kind.DISCARD).mint(destination.host, destination.disk_id, destination.vuid, TOKEN)
    return WorkTask(ref=ref, vid=vid, unit_index=index, source=source, destination=destination,
                    source_readable=readable, lease_ttl=30, discard_ticket=ticket)


def node_of(cluster: LocalCluster, unit: Unit) -> Service:
    return next(bn for bn in cluster.blobnodes if bn.url == unit.host)


def test_migrate_copies_resumes_rebuilds_and_gives_up_a_dead_destination(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(blobnodes=7, min_volumes=1)
    rng = random.Random(11)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        tokens = [wait_for_put(client, rng.randbytes(size)) for size in SIZES]
    blobs = [bid for token in tokens for bid in Location.from_token(token, cluster.secret.encode()).blob_ids()]
    vid = Counter(v for v, _ in blobs).most_common(1)[0][0]
    bids = sorted(b for v, b in blobs if v == vid)
    marked, purged = bids[:3], bids[3:5]  # a delete half done (mark-deleted), and one finished (gone)
    live = set(bids[5:])
    config = WorkerConfig(clustermgr_hosts=[cm.url for cm in cluster.clustermgr], migrate_piece_bytes=300_000,
                          migrate_concurrency=3, migrate_report_interval=0.001)

    async def scenario() -> None:
        async with ClusterClient(config.clustermgr_hosts) as cm, BlobnodeClient() as bn:
            units = (await cm.get_volume(vid)).units
            for bid in marked + purged:
                for u in units:
                    await bn.mark_delete_shard(u.host, u.disk_id, u.vuid, bid,
                                               **as_tinker(u.host, u.disk_id, u.vuid, bid))
            for bid in purged:
                for u in units:
                    await lose_shard(bn, u, bid)
            migrator = UnitMigrator(cm, bn, config)

            async def listed(unit: Unit) -> dict[int, ShardInfo]:
                return {s.bid: s for s in await bn.list_shards(unit.host, unit.disk_id, unit.vuid)}

            async def settled(unit: Unit) -> dict[int, ShardInfo]:
                """The unit's shards once puts still under way there have landed: a client that stops waiting
                does not stop a put the blobnode already took (it commits with its disk's next group)."""
                now = await listed(unit)
                for _ in range(50):
                    await asyncio.sleep(0.2)
                    before, now = now, await listed(unit)
                    if now == before:
                        return now
                raise AssertionError(f"{unit.vuid} kept changing")

            async def new_destination(index: int) -> Unit:
                unit = await cm.alloc_unit(vid, index)
                # as a scheduler does, under its lease's epoch
                await bn.create_chunk(unit.host, unit.disk_id, unit.vuid, scheduler_epoch=1,
                                      epoch_ticket=epoch_ticket(1))
                await bn.set_task_fence(unit.host, unit.disk_id, unit.vuid, 1, TOKEN, epoch_ticket=epoch_ticket(1))
                return unit

            async def assert_moved(index: int, destination: Unit, originals: dict[int, ShardInfo]) -> None:
                moved = await listed(destination)
                assert set(moved) == live  # deleted blobs are not resurrected
                assert all((moved[b].size, moved[b].crc, moved[b].status) == (originals[b].size, originals[b].crc,
                                                                                 "normal") for b in live)

            # 1. Copy from a healthy source, interrupted after a few shards, then resumed.
            originals = await listed(units[0])
            destination = await new_destination(0)
            task = work_task(vid, 0, units[0], destination)
            reports: list[TaskProgress] = []

            async def stop_after_three(progress: TaskProgress) -> None:
                reports.append(progress)
                if progress.done_shards >= 3:
                    raise Interrupted

            with pytest.raises(Interrupted):
                await migrator.migrate(task, stop_after_three)
            moved_before = await settled(destination)
            first_run = len(moved_before)
            assert 3 <= first_run < len(live)
            # Meanwhile two blobs are deleted: one the destination already holds, one it does not.
            for bid in (min(moved_before), min(live - set(moved_before))):
                for u in units:
                    await bn.mark_delete_shard(u.host, u.disk_id, u.vuid, bid,
                                               **as_tinker(u.host, u.disk_id, u.vuid, bid))
                live.discard(bid)
            reports.clear()
            final = await migrator.migrate(task, lambda p: _append(reports, p))
            assert migrator.stats.resumed_shards == first_run - 1  # what the destination had is not moved again
            assert migrator.stats.rebuilt_shards == 0 and migrator.stats.copied_shards >= len(live) - first_run
            assert (final.done_shards, final.total_shards) == (len(live), len(live))
            assert final.done_bytes == final.total_bytes == sum(originals[b].size for b in live)
            assert reports[-1] == final and reports[0].done_shards >= first_run
            await assert_moved(0, destination, originals)

            # 2. The source's blobnode killed: every shard is rebuilt from the other units; a blob with fewer
            # than N shards left anywhere is reported lost and does not hold up the rest.
            originals = await listed(units[2])
            lost = max(live)
            for u in units[3:]:
                await lose_shard(bn, u, lost)
            live.discard(lost)
            node_of(cluster, units[2]).kill9()
            destination = await new_destination(2)
            before = migrator.stats.model_copy()
            final = await migrator.migrate(work_task(vid, 2, units[2], destination, readable=False),
                                           lambda p: _append(reports, p))
            assert migrator.stats.rebuilt_shards - before.rebuilt_shards == len(live)
            assert migrator.stats.lost_shards - before.lost_shards == 1
            assert migrator.stats.copied_shards == before.copied_shards
            assert final.done_shards == len(live) and final.lost_bids == [lost]  # the switch names it lost
            await assert_moved(2, destination, originals)
            await cm.update_unit(vid, 2, destination.vuid, destination.disk_id, lost=final.lost_bids)

            # 3. The destination's blobnode killed mid-run: the task gives up that destination. The source's blobnode
            # of step 2 back first: else the blob lost there (its shards gone from units 3-5, unit 2 unreachable) may
            # not be proven lost, and a run that reaches it before the kill fails on it instead.
            node_of(cluster, units[2]).start()
            destination = await new_destination(3)
            target = node_of(cluster, destination)

            async def kill_destination(progress: TaskProgress) -> None:
                if progress.done_shards >= 2:
                    target.kill9()

            with pytest.raises(DestinationFailed):
                await migrator.migrate(work_task(vid, 3, units[3], destination), kill_destination)

    asyncio.run(scenario())


async def _append(reports: list[TaskProgress], progress: TaskProgress) -> None:
    reports.append(progress)
