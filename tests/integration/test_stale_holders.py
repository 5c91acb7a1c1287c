"""A stale worker or a stale scheduler cannot change a live unit (issue 62, items 3 and 4), against real processes.

A worker paused past its task lease, whose task another worker finished meanwhile, touches nothing when it wakes
(its own deadline passed), and the destructive call it would have sent is refused by the new live unit's
blobnode. A scheduler restarted under the same name takes a new epoch at once; the old process, paused mid-round
and woken, is refused by clustermgr and by the blobnode whose sealed chunk it would reopen."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from blobstore import AsyncClient
from blobstore_server.libs.proto.blobnode import ChunkStatus, IOClass, TaskFence
from blobstore_server.libs.proto.cluster import VolumeStatus
from blobstore_server.libs.proto.clustermgr import Fence
from blobstore_server.libs.proto.scheduler import LEADER_KEY, TASK_PREFIX, LeaderRecord, ManualMigrate, TaskRecord
from blobstore_server.libs.proto.switches import OFF, TaskType, switch_key
from blobstore_server.libs.rpc import errors
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.scheduler.client import SchedulerClient
from tests.support.metrics import sample
from tests.support.processes import TEST_SECRET, LocalCluster, Pauses, Service, free_port, process_state
from tests.support.shards import assert_every_shard_present, blobs_of
from tests.support.tickets import epoch_ticket, minter
from tests.support.waiting import eventually

ClusterFactory = Callable[..., LocalCluster]
SIZES = [3_000, 40_000, 300_000, 1_200_000]


async def store(cluster: LocalCluster, count: int, seed: int, sizes: list[int] = SIZES) -> dict[str, bytes]:
    rng = random.Random(seed)
    async with AsyncClient([cluster.access[0].url], timeout=60) as client:
        objects = [rng.randbytes(sizes[i % len(sizes)] + rng.randrange(100)) for i in range(count)]
        return {await client.put(data): data for data in objects}


async def task_record(cm: ClusterClient, task_id: str) -> TaskRecord | None:
    return next((t for raw in (await cm.kv_list(TASK_PREFIX)).values()
                 if (t := TaskRecord.model_validate_json(raw)).task_id == task_id), None)


async def leader(cm: ClusterClient) -> LeaderRecord:
    return LeaderRecord.model_validate_json(await cm.kv_get(LEADER_KEY) or "")


def start_service(role: str, workdir: Path, **config: object) -> Service:
    port = free_port()
    workdir.mkdir()
    return Service(role, {"bind_addr": f"127.0.0.1:{port}", **config}, workdir, f"http://127.0.0.1:{port}").start(60.0)


def test_a_worker_paused_past_its_lease_cannot_discard_on_the_unit_another_worker_finished(
        cluster_factory: ClusterFactory, tmp_path: Path) -> None:
    """The first worker, throttled, is SIGSTOPped mid-move; its lease lapses, a second worker is handed the task
    and finishes it, the destination becomes the live unit and a PUT is acknowledged onto it. Woken, the first
    worker gives the task up by its own deadline and sends nothing. The discard it could have sent (driven here
    with the blobnode client the worker uses, under its stale hand-out's token: no real worker sends it past its
    deadline) is refused by the live unit's blobnode, which says why; every shard of every blob is present.

    One volume at first (no idle spare), so the moved one; while it is locked for the move, PUTs fill the volume
    made in its place, so that once unlocked the moved one has the most room and takes the next PUT."""
    slow = {"task_poll": 0.5, "task_runners": 1, "migrate_report_interval": 0.5, "migrate_mb_per_sec": 0.1,
            "migrate_concurrency": 1}
    cluster = cluster_factory(blobnodes=7, disks=1, schedulers=1, worker=slow,
                              clustermgr={"code_modes": [{"code_mode": "EC3P3", "min_volumes": 1,
                                                          "min_idle_volumes": 0}]},
                              scheduler={"task_lease_ttl": 6.0, "cancel_hold": 0.5})
    cm_urls = [c.url for c in cluster.clustermgr]
    first = cluster.background["worker"]

    async def scenario() -> None:
        objects = await store(cluster, 8, seed=62)
        async with ClusterClient(cm_urls) as cm, SchedulerClient(cm) as scheduler, BlobnodeClient() as bn:
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)
            (vid,) = {vid for location in objects for vid, _ in blobs_of(cluster, location)}
            volume = await cm.get_volume(vid)
            used = {u.disk_id for u in volume.units}
            target = next(d.disk_id for d in await cm.list_disks() if d.disk_id not in used)
            task = await scheduler.manual_migrate(ManualMigrate(vid=vid, index=2, disk_id=target))

            async def moving() -> TaskRecord | None:
                record = await task_record(cm, task.task_id)
                return record if record and record.worker == first.url and record.done_shards > 0 else None

            stale = await eventually(moving, 60, "the first worker moving shards")
            assert stale.done_shards < stale.total_shards and stale.destination is not None
            dest = stale.destination
            with Pauses() as pauses:
                pauses.stop(first)
                second = start_service("worker", tmp_path / "second-worker", clustermgr_hosts=cm_urls, task_poll=0.5)
                try:
                    async def finished() -> TaskRecord | None:
                        record = await task_record(cm, task.task_id)
                        return record if record and not record.open else None

                    # Onto the volume made while the moved one is locked: well fuller than it afterwards.
                    fillers = await store(cluster, 8, seed=63, sizes=[2_000_000])
                    assert vid not in {v for location in fillers for v, _ in blobs_of(cluster, location)}
                    objects.update(fillers)
                    done = await eventually(finished, 90, "the second worker finishing the task")
                    assert done.worker == second.url and done.token > stale.token and done.destination == dest
                    assert (await cm.get_volume(vid)).units[2] == dest  # the destination is the live unit
                    live = await bn.chunk_stat(dest.host, dest.disk_id, dest.vuid)
                    assert live.task_fence is TaskFence.CLOSED
                    async with AsyncClient([cluster.access[0].url], timeout=60) as client:
                        for attempt in range(40):  # until the allocator leases the moved volume again
                            data = random.Random(attempt).randbytes(300_000)  # past access's reservations
                            location = await client.put(data)
                            objects[location] = data
                            if blobs_of(cluster, location)[0][0] == vid:
                                break
                            await asyncio.sleep(0.5)
                        else:
                            raise AssertionError(f"no PUT went to volume {vid}")
                    acked = blobs_of(cluster, location)[0][1]
                    held = await bn.shard_stat(dest.host, dest.disk_id, dest.vuid, acked)
                    assert held.status == "normal"
                    assert process_state(first.pid) == "T"  # still paused all along
                finally:
                    second.stop()

            async def gave_up() -> bool:
                try:
                    return sample(first.url, "blobstore_worker_tasks_given_up_total", {"why": "lapsed"}) == 1
                except httpx.HTTPError:  # a box this loaded answers slowly
                    return False

            await eventually(gave_up, 30, "the woken worker giving its task up by its own deadline")
            with pytest.raises(errors.Fenced, match=r"the chunk of vuid \d+ is live: its task fence closed") as refused:
                await bn.discard_shard(dest.host, dest.disk_id, dest.vuid, acked, io_class=IOClass.BACKGROUND,
                                       task_token=stale.token, ticket=minter(TEST_SECRET, Kind.DISCARD).mint(
                                           dest.host, dest.disk_id, dest.vuid, stale.token))  # as it was handed
            print(f"the stale worker's discard (token {stale.token}) refused: {refused.value}")
            assert (await bn.shard_stat(dest.host, dest.disk_id, dest.vuid, acked)).status == "normal"
            await assert_every_shard_present(cluster, objects)

    asyncio.run(scenario())


def test_a_same_name_restart_takes_a_new_epoch_and_fences_the_old_process(
        cluster_factory: ClusterFactory, tmp_path: Path) -> None:
    """The active scheduler is SIGSTOPped mid-round (about to reserve a destination, its call to the source's
    blobnode held up by pausing that node), and a new process is started under its name: it takes the next epoch
    at once, seals the source again under it and prepares the task. The old process, woken, stands by: refused by
    clustermgr (the reservation it goes on to ask for) or by the source's blobnode (its seal timed out while it
    slept, so it seals again before reserving), or, when its election round runs first, on reading the namesake's
    newer lease record. Whichever it meets first, the store refuses its epoch: the source's blobnode when it asks
    for `/chunk/readwrite` under it (driven here with the scheduler's blobnode client: the woken process stands by
    and never gets that far by itself), clustermgr any change under its fence; the sealed source stays
    read-only."""
    ttl = 3.0
    cluster = cluster_factory(blobnodes=7, disks=1, min_volumes=1, schedulers=1, scheduler={"election_ttl": ttl})
    cm_urls = [c.url for c in cluster.clustermgr]
    old = cluster.background["scheduler0"]

    async def scenario() -> None:
        async with ClusterClient(cm_urls) as cm, SchedulerClient(cm) as scheduler, BlobnodeClient() as bn:
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)
            volume = (await cm.list_volumes())[0]
            source = volume.units[2]
            source_node = next(n for n in cluster.blobnodes if n.url == source.host)
            before = await leader(cm)
            assert before.host == old.url
            with Pauses() as pauses:
                pauses.stop(source_node)
                task = await scheduler.manual_migrate(ManualMigrate(vid=volume.vid, index=2))

                async def locked() -> bool:
                    return (await cm.get_volume(volume.vid)).status is VolumeStatus.LOCK

                await eventually(locked, 10, "the old scheduler locking the volume, then sealing the source")
                pauses.stop(old)  # mid-round: its read-only call waits on the paused node
                pauses.cont(source_node)
                new = start_service("scheduler", tmp_path / "namesake", clustermgr_hosts=cm_urls, host=old.url,
                                    election_ttl=ttl)
                try:
                    async def new_epoch() -> LeaderRecord | None:
                        record = await leader(cm)
                        return record if record.epoch > before.epoch else None

                    taken = await eventually(new_epoch, 10, "the namesake taking a new epoch")
                    assert (taken.host, taken.epoch) == (old.url, before.epoch + 1)

                    async def prepared() -> bool:
                        record = await task_record(cm, task.task_id)
                        return record is not None and record.destination is not None

                    await eventually(prepared, 20, "the namesake preparing the task")
                    assert (await bn.disk_stat(source.host, source.disk_id)).scheduler_epoch == taken.epoch
                    pauses.cont(old)

                    async def stood_by() -> bool:
                        return sample(old.url, "blobstore_scheduler_active") == 0

                    await eventually(stood_by, 20, "the woken old scheduler standing by")
                    with pytest.raises(errors.Fenced, match=f"epoch {before.epoch} is superseded"):
                        await bn.set_chunk_readonly(source.host, source.disk_id, source.vuid, readonly=False,
                                                    scheduler_epoch=before.epoch,
                                                    epoch_ticket=epoch_ticket(before.epoch))  # its own
                    chunks = {c.vuid: c.status for c in await bn.list_chunks(source.host, source.disk_id)}
                    assert chunks[source.vuid] is ChunkStatus.READONLY
                    with pytest.raises(errors.Fenced):  # any change under the old epoch, whoever sends it
                        async with ClusterClient(cm_urls) as stale:
                            stale.fence(Fence(key=LEADER_KEY, epoch=before.epoch))
                            await stale.kv_set("scheduler/probe", "stale")
                    await asyncio.sleep(2 * ttl)  # the old process awake for two leases: it stands by
                    status = await scheduler.status(old.url)
                    assert not status.active
                    assert (await leader(cm)).epoch == taken.epoch
                    assert (await scheduler.status(new.url)).active
                finally:
                    new.stop()

    asyncio.run(scenario())

