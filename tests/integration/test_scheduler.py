"""The scheduler and the worker's task loop against real processes: a broken disk repaired, a dead node
repaired unattended, the active scheduler paused mid-repair and fenced, switches, a fenced worker refused, a manual
migration to a chosen disk and a disk drop. After each: every object reads back and every shard of it is
present on a live unit."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from blobstore import AsyncClient
from blobstore_server.cli.cli import app
from blobstore_server.cli.shards import inspect_shards
from blobstore_server.libs.proto.blobnode import ChunkStatus
from blobstore_server.libs.proto.cluster import DiskStatus, VolumeStatus
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import (
    BROKEN_AFTER_KEY,
    LEADER_KEY,
    TASK_PREFIX,
    AcquireRequest,
    LeaderRecord,
    ManualMigrate,
    TaskCancel,
    TaskProgress,
    TaskRecord,
    TaskState,
    WorkTask,
)
from blobstore_server.libs.proto.switches import OFF, ON, TaskType, switch_key
from blobstore_server.libs.rpc.errors import Conflict, Fenced, Internal, RpcError, ShardNotFound
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.scheduler.client import SchedulerClient
from blobstore_server.services.scheduler.rules import units_by_disk, units_per_disk
from tests.support.damage import lose_shard
from tests.support.metrics import sample
from tests.support.processes import SIGNED, BlobnodeFactory, LocalCluster, Service
from tests.support.tickets import as_tinker
from tests.support.waiting import eventually

ClusterFactory = Callable[..., LocalCluster]
SIZES = [10, 3_000, 40_000, 300_000, 1_200_000, 3_000_000]
WORKER = {"task_poll": 0.5, "task_runners": 2, "migrate_report_interval": 0.5}


async def store(cluster: LocalCluster, count: int, seed: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    async with AsyncClient([cluster.access[0].url], timeout=60) as client:
        objects = [rng.randbytes(SIZES[i % len(SIZES)] + rng.randrange(100)) for i in range(count)]
        return [(await client.put(data), data) for data in objects]


def _active_scheduler(cluster: LocalCluster) -> str:
    return next(s.url for name, s in cluster.background.items() if name.startswith("scheduler")
                and sample(s.url, "blobstore_scheduler_active") == 1)


async def rounds_pass(cluster: LocalCluster, rounds: int) -> None:
    """Until the active scheduler has completed `rounds` more rounds: whatever it would decide, it has."""
    url = await asyncio.to_thread(_active_scheduler, cluster)
    start = await asyncio.to_thread(sample, url, "blobstore_scheduler_rounds_total")
    await eventually(lambda: asyncio.to_thread(
        lambda: sample(url, "blobstore_scheduler_rounds_total") >= start + rounds), 30, f"{rounds} scheduler rounds")


async def switch_read(cluster: LocalCluster, task_type: TaskType, on: bool) -> None:
    """Until the active scheduler has read `task_type`'s switch as `on` (a round that read it before is over)."""
    def seen() -> bool:
        return sample(_active_scheduler(cluster), "blobstore_scheduler_switch", {"type": task_type.value}) == on

    await eventually(lambda: asyncio.to_thread(seen), 30, f"the scheduler to read {task_type} {'on' if on else 'off'}")


async def tasks_of(cm: ClusterClient) -> list[TaskRecord]:
    return [TaskRecord.model_validate_json(raw) for raw in (await cm.kv_list(TASK_PREFIX)).values()]


async def disk_status(cm: ClusterClient, disk_id: int) -> DiskStatus:
    return (await cm.get_disk(disk_id)).status


async def assert_whole(cluster: LocalCluster, cm: ClusterClient, objects: list[tuple[str, bytes]],
                       gone_disks: set[int]) -> None:
    """Every object reads back, no unit is left on a gone disk, and every shard of every blob is present."""
    assert not [(v.vid, i) for v in await cm.list_volumes() for i, u in enumerate(v.units) if u.disk_id in gone_disks]
    async with AsyncClient([cluster.access[0].url], timeout=60) as client, BlobnodeClient() as blobnodes:
        for location, data in objects:
            assert await client.get(location) == data
            reports = await inspect_shards(await client.stat(location), cm, blobnodes)
            bad = [(r.vid, r.bid, r.index, r.disk_id, r.state) for r in reports if r.state != "present"]
            assert not bad, f"shards not present: {bad[:5]}"


def busiest_disk(volumes: list, exclude: set[int] = frozenset()) -> int:  # type: ignore[type-arg]
    counts: dict[int, int] = {}
    for volume in volumes:
        for unit in volume.units:
            if unit.disk_id not in exclude:
                counts[unit.disk_id] = counts.get(unit.disk_id, 0) + 1
    return max(counts, key=lambda d: counts[d])


async def cli(cm_urls: list[str], *args: str) -> str:
    """The CLI's output (run on a thread: it runs its own event loop)."""
    result = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--clustermgr", ",".join(cm_urls)])
    assert result.exit_code == 0, result.output
    return result.output


def node_with(cluster: LocalCluster, host: str) -> Service:
    return next(bn for bn in cluster.blobnodes if bn.url == host)


def test_broken_disks_are_repaired_by_operator_and_unattended(cluster_factory: ClusterFactory) -> None:
    # 40 s: a blobnode's write fence is 20 s (half of it) from the start, so the scheduler has only that to wait out
    # before rebuilding the units of the node killed below (the production default, 600 s, gives a 300 s fence).
    cluster = cluster_factory(blobnodes=8, disks=2, min_volumes=6, schedulers=2, worker=WORKER,
                              clustermgr={"disk_broken_after": 40.0})
    cm_urls = [c.url for c in cluster.clustermgr]

    async def scenario() -> None:
        objects = await store(cluster, 24, seed=1)
        async with ClusterClient(cm_urls) as cm:
            volumes = await cm.list_volumes()
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)  # units stay where repairs put them
            # 1. Switched off, a broken disk waits; switched on, it is repaired.
            await cm.set_config(switch_key(TaskType.DISK_REPAIR), OFF)
            await switch_read(cluster, TaskType.DISK_REPAIR, on=False)
            broken = busiest_disk(volumes)
            # A delete half done on a blob of that disk (mark-deleted on every unit): it must not come back.
            by_vid = {v.vid: v for v in volumes}
            async with AsyncClient([cluster.access[0].url]) as client, BlobnodeClient() as bn:
                blobs = [b for location, _ in objects for b in (await client.stat(location)).blobs]
                deleting = next(b for b in blobs if any(u.disk_id == broken for u in by_vid[b.vid].units))
                for u in by_vid[deleting.vid].units:
                    await bn.mark_delete_shard(u.host, u.disk_id, u.vuid, deleting.min_bid,
                                               **as_tinker(u.host, u.disk_id, u.vuid, deleting.min_bid))
            objects = [(loc, data) for loc, data in objects if not await _holds(cluster, loc, deleting.min_bid)]
            await cm.set_disk(broken, status=DiskStatus.BROKEN)
            await rounds_pass(cluster, 3)  # rounds that saw the broken disk with its repair switched off
            assert await disk_status(cm, broken) is DiskStatus.BROKEN
            assert await tasks_of(cm) == []
            worker = next(s for name, s in cluster.background.items() if name.startswith("worker"))
            os.kill(worker.pid, signal.SIGSTOP)  # the tasks get prepared; none is worked on yet
            try:
                await cm.set_config(switch_key(TaskType.DISK_REPAIR), ON)

                async def prepared() -> list[TaskRecord]:
                    return [t for t in await tasks_of(cm) if t.state is TaskState.PREPARED]

                await eventually(prepared, 30, "repair tasks prepared")
                # The broken disk's node still runs and would take PUTs: before any worker lists the units, each
                # moving unit's chunk there refuses them (a blob landing on it after the listing would never
                # reach the new unit; its refused shard is owed a repair instead).
                async with BlobnodeClient() as bn:
                    chunks = {c.vuid: c.status for c in await bn.list_chunks((await cm.get_disk(broken)).host, broken)}
                assert all(chunks[t.source_vuid] is ChunkStatus.READONLY for t in await prepared()), chunks
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            await eventually(lambda: _is(cm, broken, DiskStatus.REPAIRED), 90, f"disk {broken} repaired")
            tasks = await tasks_of(cm)
            assert tasks and all(t.state is TaskState.FINISHED and t.disk_id == broken for t in tasks)
            current = {v.vid: v for v in await cm.list_volumes()}
            for t in tasks:  # each unit committed once, to the destination its task recorded
                assert t.destination is not None and current[t.vid].units[t.unit_index] == t.destination
            moved = current[deleting.vid].units[next(t.unit_index for t in tasks if t.vid == deleting.vid)]
            async with BlobnodeClient() as bn:
                held = await bn.list_all_shards(moved.host, moved.disk_id, moved.vuid)
            assert deleting.min_bid not in held  # not resurrected
            await assert_whole(cluster, cm, objects, {broken})
            listed = json.loads(await cli(cm_urls, "task", "list", "--all", "--json"))
            assert {t.task_id for t in tasks} <= {t["task_id"] for t in listed}
            progress = json.loads(await cli(cm_urls, "disk", "repair-progress", str(broken), "--json"))
            assert progress["status"] == "repaired" and progress["finished"] == progress["tasks"] == len(tasks)
            assert progress["done_bytes"] == progress["total_bytes"] > 0

            # 2. Unattended repair is on (by default after 10 minutes of silence). A node back in time keeps its disks;
            # a blobnode killed and left down has its disks repaired unattended.
            assert (await cm.list_config())[BROKEN_AFTER_KEY] == "40.0"  # seeded from clustermgr's config file
            volumes = await cm.list_volumes()
            victim_disk = busiest_disk(volumes, {broken})
            victim = node_with(cluster, (await cm.get_disk(victim_disk)).host)
            victim_disks = {d.disk_id for d in await cm.list_disks() if d.host == victim.url}
            await cm.set_config(BROKEN_AFTER_KEY, "9")
            os.kill(victim.pid, signal.SIGSTOP)
            await asyncio.sleep(4)
            os.kill(victim.pid, signal.SIGCONT)
            await asyncio.sleep(9)
            assert {(await cm.get_disk(d)).status for d in victim_disks - {broken}} == {DiskStatus.NORMAL}
            await cm.set_config(BROKEN_AFTER_KEY, "3")
            victim.kill9()
            for disk_id in victim_disks:
                await eventually(lambda d=disk_id: _is(cm, d, DiskStatus.REPAIRED), 120, f"disk {disk_id} repaired")
            await assert_whole(cluster, cm, objects, {broken, *victim_disks})
            assert not [v.vid for v in await cm.list_volumes() if v.under_spread]  # 7 live hosts for 6 units

            # 3. A disk whose system calls fail is reported broken by its own blobnode, then repaired. The fault
            # is real: its data folder becomes a file, so creating a chunk there fails (ENOTDIR).
            gone = {broken, *victim_disks}
            failing = await cm.get_disk(busiest_disk(await cm.list_volumes(), gone))
            data = Path(failing.path) / "data"
            data.rename(data.with_name("data.gone"))
            data.write_bytes(b"not a folder")
            async with BlobnodeClient() as bn:
                for epoch in range(3):
                    try:
                        await bn.create_chunk(failing.host, failing.disk_id, Vuid.make(4000, 0, epoch + 1))
                    except Internal as exc:
                        assert "disk I/O failed" in str(exc)
                    else:
                        raise AssertionError("a chunk was created in a file")
            await eventually(lambda: _is(cm, failing.disk_id, DiskStatus.REPAIRED), 90,
                             f"disk {failing.disk_id} repaired")
            await assert_whole(cluster, cm, objects, {*gone, failing.disk_id})

    asyncio.run(scenario())


def test_a_paused_scheduler_is_superseded_and_fenced(cluster_factory: ClusterFactory) -> None:
    """The active scheduler SIGSTOPped for three leases mid-repair: the standby takes over (a new epoch), the
    worker gives its task of the old epoch up (its own deadline passes; the new scheduler would refuse it) and it
    is handed out again, resuming where it stopped (no shard moved twice), the repair finishes; woken up, the old
    scheduler stands by and nothing it does takes effect: every shard stays on a live unit. (A scheduler killed -9
    is the same takeover without the wake-up.)"""
    slow = {**WORKER, "task_runners": 1, "migrate_mb_per_sec": 0.25, "migrate_concurrency": 1}
    ttl = 3.0
    cluster = cluster_factory(blobnodes=8, disks=1, min_volumes=4, schedulers=2, worker=slow,
                              scheduler={"election_ttl": ttl, "task_lease_ttl": 4.0})
    cm_urls = [c.url for c in cluster.clustermgr]

    async def scenario() -> None:
        objects = await store(cluster, 24, seed=5)
        async with ClusterClient(cm_urls) as cm, httpx.AsyncClient(auth=SIGNED) as http:
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)
            broken = busiest_disk(await cm.list_volumes())
            await cm.set_disk(broken, status=DiskStatus.BROKEN)

            async def moving() -> bool:
                return any(t.open and 0 < t.done_shards < t.total_shards for t in await tasks_of(cm))

            await eventually(moving, 60, "a repair task under way")
            old = LeaderRecord.model_validate_json(await cm.kv_get(LEADER_KEY) or "")
            paused = next(s for n, s in cluster.background.items() if n.startswith("sched") and s.url == old.host)
            os.kill(paused.pid, signal.SIGSTOP)
            paused_at = time.monotonic()
            try:
                async def taken_over() -> bool:
                    raw = await cm.kv_get(LEADER_KEY)
                    return raw is not None and LeaderRecord.model_validate_json(raw).epoch == old.epoch + 1

                await eventually(taken_over, 10 * ttl, "the standby scheduler taking over")
                new = LeaderRecord.model_validate_json(await cm.kv_get(LEADER_KEY) or "")

                async def let_go() -> bool:
                    """The worker gave its task of the old epoch up: by its own deadline, its renewals going
                    unanswered (what it does, the paused scheduler answering nothing), or refused by the new one."""
                    worker = (await http.get(f"{cluster.background['worker'].url}/metrics")).text
                    scheduler = (await http.get(f"{new.host}/metrics")).text
                    return (_sample(worker, 'blobstore_worker_tasks_given_up_total{why="lapsed"}') > 0
                            or _sample(scheduler, "blobstore_scheduler_fenced_total") > 0)

                await eventually(let_go, 30, "the worker's task of the old epoch given up")
                await asyncio.sleep(max(0.0, paused_at + 3 * ttl - time.monotonic()))  # three leases at least
            finally:
                os.kill(paused.pid, signal.SIGCONT)
            await eventually(lambda: _is(cm, broken, DiskStatus.REPAIRED), 120, f"disk {broken} repaired")
            scrape = (await http.get(f"{cluster.background['worker'].url}/metrics")).text
            assert _sample(scrape, 'blobstore_worker_migrated_shards_total{how="resumed"}') > 0
            await asyncio.sleep(2 * ttl)  # the old one awake for two leases: it stands by and changes nothing
            status = (await http.get(f"{old.host}/status")).json()
            assert not status["active"] and status["leader"] == new.host
            assert LeaderRecord.model_validate_json(await cm.kv_get(LEADER_KEY) or "").epoch == new.epoch
            current = {v.vid: v for v in await cm.list_volumes()}
            for t in await tasks_of(cm):
                assert t.state is TaskState.FINISHED and t.destination is not None
                assert current[t.vid].units[t.unit_index] == t.destination
            await assert_whole(cluster, cm, objects, {broken})

    asyncio.run(scenario())


def test_a_volume_one_loss_from_losing_blobs_is_rebuilt_first_and_past_the_caps(
        cluster_factory: ClusterFactory) -> None:
    """Two disks under one EC3P3 volume's units break at once (its margin: 1) while a throttled worker is
    busy: that volume is rebuilt back to margin 2 within seconds, past the worker's MB/s cap, while the
    volumes that lost one unit (margin 2) still wait their turn at the cap."""
    slow = {**WORKER, "task_runners": 1, "migrate_mb_per_sec": 0.1, "migrate_concurrency": 1}
    cluster = cluster_factory(blobnodes=8, disks=2, min_volumes=6, schedulers=1, worker=slow)
    cm_urls = [c.url for c in cluster.clustermgr]

    async def scenario() -> None:
        objects = await store(cluster, 30, seed=7)
        async with ClusterClient(cm_urls) as cm:
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)
            await cm.set_config(switch_key(TaskType.DISK_REPAIR), OFF)
            volumes = await cm.list_volumes()
            critical = next(v for v in volumes
                            if sum(len({u.disk_id for u in v.units} & {u.disk_id for u in w.units}) >= 1
                                   for w in volumes if w.vid != v.vid) >= 2)
            broken = {critical.units[0].disk_id, critical.units[1].disk_id}
            others = {v.vid for v in volumes if v.vid != critical.vid and any(u.disk_id in broken for u in v.units)}
            assert others, "the test needs volumes that lose only one unit"
            for disk_id in broken:
                await cm.set_disk(disk_id, status=DiskStatus.BROKEN)
            await cm.set_config(switch_key(TaskType.DISK_REPAIR), ON)
            started = time.monotonic()

            async def lost_units(vid: int) -> int:
                return sum(u.disk_id in broken for u in (await cm.get_volume(vid)).units)

            await eventually(lambda: _fewer(lost_units(critical.vid), 2), 30, f"volume {critical.vid} back to margin 2")
            took = time.monotonic() - started
            pending = [vid for vid in others if await lost_units(vid)]
            print(f"margin-1 volume rebuilt in {took:.1f}s; {len(pending)}/{len(others)} margin-2 volumes waiting")
            assert took < 20
            assert pending, "the margin-2 volumes went at the cap, they cannot all be done yet"
            async with AsyncClient([cluster.access[0].url], timeout=60) as client:
                for location, data in objects:
                    assert await client.get(location) == data

    asyncio.run(scenario())


async def _fewer(count: Awaitable[int], than: int) -> bool:
    return await count < than


def test_fenced_worker_is_refused_then_manual_migrate_and_drop(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(blobnodes=8, disks=1, min_volumes=4, schedulers=1, worker=WORKER,
                              scheduler={"task_lease_ttl": 2.0, "cancel_hold": 0.5})
    cm_urls = [c.url for c in cluster.clustermgr]
    worker = cluster.background["worker"]

    async def scenario() -> None:
        objects = await store(cluster, 18, seed=3)
        async with ClusterClient(cm_urls) as cm, SchedulerClient(cm) as scheduler:
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)
            volume = (await cm.list_volumes())[0]
            used = {u.disk_id for u in volume.units}
            target = next(d.disk_id for d in await cm.list_disks() if d.disk_id not in used)
            os.kill(worker.pid, signal.SIGSTOP)  # the real worker stays out of the way for a while
            try:
                task = await scheduler.manual_migrate(ManualMigrate(vid=volume.vid, index=2, disk_id=target))
                stale = await _acquire(scheduler, "stale-worker")
                assert stale.ref.task_id == task.task_id and stale.destination.disk_id == target
                await asyncio.sleep(2.5)  # its lease lapses
                fresh = await _acquire(scheduler, "fresh-worker")
                assert fresh.ref.task_id == task.task_id
                # each hand-out carries the scheduler's discard ticket for its destination and token: the lapsed
                # one's is fenced off, the current one's taken (nothing there to discard yet)
                dest, missing = fresh.destination, 2**40
                async with BlobnodeClient() as bn:
                    with pytest.raises(Fenced):
                        await bn.discard_shard(dest.host, dest.disk_id, dest.vuid, missing, task_token=stale.ref.token,
                                               ticket=stale.discard_ticket)
                    with pytest.raises(ShardNotFound):
                        await bn.discard_shard(dest.host, dest.disk_id, dest.vuid, missing, task_token=fresh.ref.token,
                                               ticket=fresh.discard_ticket)
                progress = TaskProgress(ref=stale.ref, done_bytes=1, done_shards=1, total_bytes=2, total_shards=2)
                for call in (scheduler.complete(stale.ref), scheduler.report(progress), scheduler.renew(stale.ref)):
                    try:
                        await call
                    except Conflict as exc:
                        assert "held by fresh-worker" in str(exc)
                    else:
                        raise AssertionError("a fenced worker's call was accepted")
                await scheduler.cancel(TaskCancel(ref=fresh.ref, reason="test gives it back"))
                assert (await cm.get_volume(volume.vid)).units[2].vuid == volume.units[2].vuid  # nothing committed
            finally:
                os.kill(worker.pid, signal.SIGCONT)

            async def migrated() -> bool:  # the record is final only after the unit switched and the old chunk went
                return any(t.task_id == task.task_id and not t.open for t in await tasks_of(cm))

            await eventually(migrated, 60, "the manual migration")
            assert (await cm.get_volume(volume.vid)).units[2].disk_id == target
            record = next(t for t in await tasks_of(cm) if t.task_id == task.task_id)
            assert record.state is TaskState.FINISHED and record.destination is not None
            assert record.destination.disk_id == target
            await assert_whole(cluster, cm, objects, set())

            # A reclaim (the destination failed) gets a new destination, never the failed disk again, and the
            # old destination's holder is fenced off.
            other = (await cm.list_volumes())[1]
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                second = await scheduler.manual_migrate(ManualMigrate(vid=other.vid, index=0))
                first_try = await _acquire(scheduler, "reclaimer")
                await scheduler.cancel(TaskCancel(ref=first_try.ref, reason="disk full", destination_failed=True))
                retry = await _acquire(scheduler, "reclaimer")
                assert retry.ref.task_id == second.task_id
                assert retry.destination.disk_id != first_try.destination.disk_id
                assert retry.destination.vuid != first_try.destination.vuid
                try:
                    await scheduler.renew(first_try.ref)
                except Conflict as exc:
                    assert "moves" in str(exc)
                else:
                    raise AssertionError("the failed destination's lease was renewed")
                record = next(t for t in await tasks_of(cm) if t.task_id == second.task_id)
                assert first_try.destination.disk_id in record.avoid_disks and record.redo == 1
                await scheduler.cancel(TaskCancel(ref=retry.ref, reason="test gives it back"))
            finally:
                os.kill(worker.pid, signal.SIGCONT)

            async def reclaimed() -> bool:
                return any(t.task_id == second.task_id and not t.open for t in await tasks_of(cm))

            await eventually(reclaimed, 60, "the reclaimed migration")
            unit = (await cm.get_volume(other.vid)).units[0]
            assert unit.disk_id not in (other.units[0].disk_id, first_try.destination.disk_id)

            dropped = busiest_disk(await cm.list_volumes())
            await cm.set_disk(dropped, readonly=True)
            await cm.set_disk(dropped, status=DiskStatus.DROPPING)
            await eventually(lambda: _is(cm, dropped, DiskStatus.DROPPED), 90, f"disk {dropped} dropped")
            drops = [t for t in await tasks_of(cm) if t.task_type is TaskType.DISK_DROP]
            assert drops and all(t.state is TaskState.FINISHED for t in drops)
            assert all(v.status.value != "lock" for v in await cm.list_volumes())  # unlocked again
            await assert_whole(cluster, cm, objects, {dropped})

            # Past a thousand records (CubeFS #2267): a restarted scheduler loads every page.
            finished = drops[0]
            many = [finished.model_copy(update={"task_id": f"{finished.task_id}-copy{i:04d}"}) for i in range(1500)]
            for i in range(0, len(many), 100):
                await asyncio.gather(*(cm.kv_set(t.key, t.model_dump_json()) for t in many[i:i + 100]))
            active = cluster.background["scheduler0"]
            active.kill9()
            active.start()
            await eventually(lambda: _loaded(scheduler, len(many)), 30, "the restarted scheduler loading every record")

    asyncio.run(scenario())


def test_a_paused_move_gives_its_volume_to_a_disk_repair(cluster_factory: ClusterFactory) -> None:
    """A manual migration prepared (volume locked, destination reserved), its worker gone and its switch then turned
    off, must not hold the volume when one of its disks breaks: the scheduler gives the paused task back (inited,
    its destination chunk and reservation released) and the repair runs. Before, the repair waited for as long as
    the switch stayed off. Afterwards the volume takes writes again: nothing holds it locked, and the moved unit's
    chunk is writable again."""
    cluster = cluster_factory(blobnodes=8, disks=1, min_volumes=4, schedulers=1, worker=WORKER,
                              scheduler={"task_lease_ttl": 2.0})
    cm_urls = [c.url for c in cluster.clustermgr]
    worker = cluster.background["worker"]

    async def scenario() -> None:
        objects = await store(cluster, 12, seed=6)
        async with ClusterClient(cm_urls) as cm, SchedulerClient(cm) as scheduler:
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)
            volume = (await cm.list_volumes())[0]
            os.kill(worker.pid, signal.SIGSTOP)  # the real worker stays out of the way while the move is prepared
            try:
                task = await scheduler.manual_migrate(ManualMigrate(vid=volume.vid, index=2))
                taken = await _acquire(scheduler, "worker-that-goes-away")
                assert taken.ref.task_id == task.task_id
                await cm.set_config(switch_key(TaskType.MANUAL_MIGRATE), OFF)
                broken = volume.units[4].disk_id
                await cm.set_disk(broken, status=DiskStatus.BROKEN)
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            await eventually(lambda: _is(cm, broken, DiskStatus.REPAIRED), 60, f"disk {broken} repaired")
            record = next(t for t in await tasks_of(cm) if t.task_id == task.task_id)
            assert record.state is TaskState.INITED and record.destination is None, record
            assert "switched off" in record.reason
            current = await cm.get_volume(volume.vid)
            assert current.units[4].disk_id != broken and current.units[2].vuid == volume.units[2].vuid
            assert current.pending_units == {} and current.status is not VolumeStatus.LOCK, current
            dest, source = taken.destination, volume.units[2]
            async with BlobnodeClient() as bn:
                assert dest.vuid not in {c.vuid for c in await bn.list_chunks(dest.host, dest.disk_id)}
                # the move had made its source read-only; given back, the unit takes writes again
                chunks = {c.vuid: c.status for c in await bn.list_chunks(source.host, source.disk_id)}
            assert chunks[source.vuid] is ChunkStatus.NORMAL, chunks
            await assert_whole(cluster, cm, objects, set())

    asyncio.run(scenario())


async def _holds(cluster: LocalCluster, location: str, bid: int) -> bool:
    async with AsyncClient([cluster.access[0].url]) as client:
        return any(b.min_bid <= bid < b.min_bid + b.count for b in (await client.stat(location)).blobs)


async def _loaded(scheduler: SchedulerClient, at_least: int) -> bool:
    try:
        return len((await scheduler.tasks()).tasks) >= at_least
    except RpcError:
        return False


def _sample(scrape: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in scrape.splitlines() if line.startswith(name))


async def _is(cm: ClusterClient, disk_id: int, status: DiskStatus) -> bool:
    return await disk_status(cm, disk_id) is status


async def _acquire(scheduler: SchedulerClient, worker: str) -> WorkTask:
    """The next task handed out (the scheduler prepares a new one within a round)."""
    deadline = time.monotonic() + 10
    while (got := await scheduler.acquire(AcquireRequest(worker=worker))).task is None:
        assert time.monotonic() < deadline, f"no task for {worker}"
        await asyncio.sleep(0.2)
    return got.task


def test_balance_fills_a_new_empty_disk_and_stops(cluster_factory: ClusterFactory,
                                                  blobnode_factory: BlobnodeFactory) -> None:
    cluster = cluster_factory(blobnodes=6, disks=1, min_volumes=6, schedulers=1, worker=WORKER,
                              scheduler={"balance_threshold": 3})
    cm_urls = [c.url for c in cluster.clustermgr]

    async def scenario() -> None:
        objects = await store(cluster, 18, seed=4)
        async with ClusterClient(cm_urls) as cm:
            await eventually(lambda: _count_volumes(cm, 6), 30, "six volumes")
            blobnode_factory("bn-new", disks=1, clustermgr=cluster.clustermgr)
            await eventually(lambda: _has_disk(cm, 7), 15, "the new disk registered")

            async def spread() -> int:
                counts = units_per_disk(await cm.list_disks(), units_by_disk(await cm.list_volumes()))
                return max(counts.values()) - min(counts.values())

            async def settled() -> bool:
                return await spread() < 3 and not [t for t in await tasks_of(cm) if t.open]

            await eventually(settled, 120, "units spread over the new disk")
            moved = [t for t in await tasks_of(cm) if t.task_type is TaskType.BALANCE]
            assert moved and all(t.state is TaskState.FINISHED and t.target_disk == 7 for t in moved)
            await rounds_pass(cluster, 3)  # and it stays put: no ping-pong
            assert len([t for t in await tasks_of(cm) if t.task_type is TaskType.BALANCE]) == len(moved)
            assert all(v.status.value != "lock" for v in await cm.list_volumes())
            await assert_whole(cluster, cm, objects, set())

    asyncio.run(scenario())


def test_volume_inspection_queues_repairs_for_missing_shards(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(blobnodes=6, disks=1, min_volumes=2, schedulers=1, pipelines=True, worker=WORKER,
                              scheduler={"inspect_interval": 1.0, "inspect_confirm": 1.0})
    cm_urls = [c.url for c in cluster.clustermgr]

    async def scenario() -> None:
        objects = await store(cluster, 12, seed=5)
        async with ClusterClient(cm_urls) as cm, BlobnodeClient() as bn, \
                AsyncClient([cluster.access[0].url], timeout=60) as client:
            stats = [await client.stat(location) for location, _ in objects]
            (vid, repaired_bid), (_, lost_bid) = [(b.vid, b.min_bid) for s in stats[:2] for b in s.blobs[:1]]
            units = (await cm.get_volume(vid)).units
            await lose_shard(bn, units[4], repaired_bid)
            lost_units = (await cm.get_volume(stats[1].blobs[0].vid)).units
            for u in lost_units[:4]:  # EC3P3: two shards left of six, fewer than N
                await lose_shard(bn, u, lost_bid)

            async def back() -> bool:
                try:
                    await bn.shard_stat(units[4].host, units[4].disk_id, units[4].vuid, repaired_bid)
                except RpcError:
                    return False
                return True

            await eventually(back, 60, "the deleted shard repaired from the inspection's message")

            async def counted(name: str) -> bool:
                async with httpx.AsyncClient(auth=SIGNED) as http:
                    scrape = (await http.get(f"{cluster.background['scheduler0'].url}/metrics")).text
                return _sample(scrape, name) >= 1

            # the lost blob's volume may be inspected after the repaired one's
            await eventually(lambda: counted("blobstore_scheduler_inspect_lost_blobs_total"), 60,
                             "the lost blob counted")
            assert await counted("blobstore_scheduler_inspect_repairs_total")
            await assert_whole(cluster, cm, objects[:1] + objects[2:], set())

    asyncio.run(scenario())


async def _count_volumes(cm: ClusterClient, at_least: int) -> bool:
    return len(await cm.list_volumes()) >= at_least


async def _has_disk(cm: ClusterClient, disk_id: int) -> bool:
    return any(d.disk_id == disk_id and d.alive for d in await cm.list_disks())
