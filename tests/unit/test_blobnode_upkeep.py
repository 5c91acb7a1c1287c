"""The blobnode's upkeep of its disks: the trash's names and hold (`services/blobnode/trash.py`) and the compaction
rule (`services/blobnode/compaction.py`), free of I/O; then a real in-process blobnode whose rounds purge its trash
and compact a chunk, and whose reads go on while a compaction copies."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from blobstore_server.libs.chunkfile import CHUNK_HEADER_SIZE, ShardStatus
from blobstore_server.libs.proto.blobnode import ChunkStat, ChunkStatus
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.services.blobnode.compaction import CompactionPlan, CompactRule, worth
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.node import Blobnode
from blobstore_server.services.blobnode.trash import TrashEntry, TrashReason, due, next_cut, trash_entry, trash_name
from blobstore_server.services.blobnode.upkeep import DiskUpkeep

MB = 1 << 20
HOUR = 3600.0

# the trash


def test_a_trash_name_says_which_chunk_why_and_when() -> None:
    name = trash_name("00000001000000000000000a", TrashReason.COMPACTED, 1700000000.1225)
    assert name == "00000001000000000000000a.compacted.1700000000123"  # rounded up: the hold never ends early
    assert trash_entry(name, size=10, disk_bytes=8, changed=5.0) == TrashEntry(
        name, "00000001000000000000000a", "compacted", 1700000000.123, 10, 8)


@pytest.mark.parametrize("name", ["00000001000000000000000a", "a.released", "a.released.soon", "a.eaten.12", "x.y.z"])
def test_a_file_named_otherwise_counts_from_its_ctime(name: str) -> None:
    entry = trash_entry(name, size=10, disk_bytes=8, changed=5.0)
    assert (entry.chunk_id, entry.why, entry.moved_at) == (name, "", 5.0)


def test_files_are_due_their_hold_after_they_came_oldest_first() -> None:
    def entry(name: str, moved_at: float) -> TrashEntry:
        return TrashEntry(name, name, "released", moved_at, 1, 1)

    entries = [entry("c", 300.0), entry("a", 100.0), entry("b", 200.0), entry("d", 100.0)]
    assert due(entries, hold=100.0, now=299.0) == [entries[1], entries[3]]
    assert due(entries, hold=100.0, now=300.0) == [entries[1], entries[3], entries[2]]  # at its hold's very end
    assert due(entries, hold=100.0, now=400.0)[-1] == entries[0]
    assert due(entries, hold=0.0, now=0.0) == []
    assert len(due(entries, hold=0.0, now=300.0)) == 4


def test_a_file_is_cut_a_step_at_a_time_then_removed() -> None:
    cuts, size = [], 2500
    while True:
        size = next_cut(size, 1000)
        cuts.append(size)
        if not size:
            break
    assert cuts == [1500, 500, 0]
    assert next_cut(0, 1000) == 0  # an empty file goes at once


# the compaction rule


def chunk(chunk_id: str = "c", *, used: int = 100 * MB, garbage: int = 60 * MB,
          status: ChunkStatus = ChunkStatus.NORMAL, shards: int = 10) -> ChunkStat:
    live = used - garbage
    return ChunkStat(chunk_id=chunk_id, vuid=1 << 24, status=status, chunk_size=1 << 30, created=0.0, disk_id=1,
                     shard_count=shards, live_bytes=live, physical_bytes=live, write_offset=CHUNK_HEADER_SIZE + used,
                     punched_bytes=garbage, disk_bytes=live)


RULE = CompactRule(garbage_ratio=0.5, min_garbage=10 * MB, idle=60.0)


@pytest.mark.parametrize(("stat", "compact"), [
    (chunk(), True),  # 60 % garbage, 60 MiB
    (chunk(garbage=50 * MB), True),  # just the ratio
    (chunk(garbage=50 * MB - 1), False),  # just under it
    (chunk(used=20 * MB, garbage=10 * MB), True),  # just the minimum
    (chunk(used=20 * MB, garbage=10 * MB - 1), False),  # just under it, whatever the ratio
    (chunk(garbage=100 * MB), True),  # nothing live left
    (chunk(used=0, garbage=0), False),  # empty
    (chunk(status=ChunkStatus.READONLY), False),  # sealed for a move, which copies its live shards anyway
])
def test_what_is_worth_a_compaction(stat: ChunkStat, compact: bool) -> None:
    assert worth(RULE, stat) is compact


def test_no_garbage_is_never_worth_it_even_with_no_minimum() -> None:
    rule = CompactRule(garbage_ratio=0.01, min_garbage=0, idle=0.0)
    assert not worth(rule, chunk(garbage=0))
    assert worth(rule, chunk(garbage=1 * MB))
    assert not worth(CompactRule(garbage_ratio=1.0, min_garbage=0, idle=0.0), chunk(garbage=99 * MB))


def test_a_chunk_is_compacted_once_quiet_for_the_idle_time() -> None:
    plan = CompactionPlan(RULE)
    assert plan.next([chunk()], now=0.0) is None  # first seen: quiet for 0 s
    assert plan.next([chunk()], now=59.0) is None
    assert plan.next([chunk()], now=60.0) == chunk()
    busy = chunk(used=101 * MB, garbage=60 * MB)  # a write: its count starts over
    assert plan.next([busy], now=100.0) is None and plan.quiet_for("c", 100.0) == 0.0
    deleted = chunk(used=101 * MB, garbage=61 * MB, shards=9)  # a delete, too
    assert plan.next([deleted], now=150.0) is None
    assert plan.next([deleted], now=210.0) == deleted


def test_the_most_garbage_goes_first_and_a_failed_one_waits() -> None:
    plan = CompactionPlan(CompactRule(garbage_ratio=0.5, min_garbage=0, idle=0.0, retry=HOUR))
    small, big, sealed = chunk("a", garbage=60 * MB), chunk("b", garbage=90 * MB), chunk(
        "c", garbage=99 * MB, status=ChunkStatus.READONLY)
    stats = [small, big, sealed]
    assert plan.next(stats, now=0.0) == big
    plan.failed("b", now=0.0)
    assert plan.next(stats, now=10.0) == small
    assert plan.next(stats, now=HOUR) == big  # its retry time has come


def test_a_chunk_gone_is_forgotten() -> None:
    plan = CompactionPlan(CompactRule(garbage_ratio=0.5, min_garbage=0, idle=60.0, retry=HOUR))
    plan.next([chunk("a")], now=0.0)
    plan.failed("a", now=0.0)
    plan.next([chunk("b")], now=30.0)  # "a" compacted or released meanwhile
    assert plan.quiet_for("a", 100.0) == 0.0
    assert plan.next([chunk("a")], now=100.0) is None  # seen anew: quiet for 0 s, its failure forgotten
    assert plan.next([chunk("a")], now=160.0) == chunk("a")


# a real in-process blobnode


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Blobnode]:
    overrides = getattr(request, "param", {})
    config = BlobnodeConfig(disks=[{"path": str(tmp_path / "d"), "disk_id": 1}], sync=False, delete_hold=0,
                            trash_hold=HOUR, trash_purge_step=MB, compact_garbage_ratio=0.5, compact_min_garbage=MB,
                            compact_idle=0, **overrides)
    blobnode = Blobnode(config)
    try:
        yield blobnode
    finally:
        blobnode.close()


A = Vuid.make(1, 0, 1)
SHARD = 256 << 10


async def fill(node: Blobnode, vuid: int, shards: int) -> None:
    await node.create_chunk(1, vuid, 64 * MB)
    for bid in range(1, shards + 1):
        await node.put_shard(1, vuid, bid, bytearray(bytes([bid]) * SHARD))


async def delete(node: Blobnode, vuid: int, bids: range) -> None:
    for bid in bids:
        await node.set_shard_status(1, vuid, bid, ShardStatus.MARK_DELETED)
        await node.set_shard_status(1, vuid, bid, None)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def trash_of(node: Blobnode) -> list[str]:
    return sorted(os.listdir(node.disk(1).path / ".trash"))


def test_a_released_chunk_waits_in_trash_for_its_hold_then_goes(node: Blobnode) -> None:
    async def scenario() -> None:
        await fill(node, A, 12)  # 3 MiB
        chunk_id = (await node.chunk_stat(1, A)).chunk_id
        before = time.time()
        await node.set_chunk_status(1, A, ChunkStatus.RELEASED)
        (name,) = trash_of(node)
        entry = trash_entry(name, 0, 0, 0.0)
        assert (entry.chunk_id, entry.why) == (chunk_id, "released") and before <= entry.moved_at <= time.time() + 0.001
        stat = await node.disk_stat(1)
        assert stat.trash_files == 1 and stat.trash_bytes >= 12 * SHARD
        upkeep = DiskUpkeep(node, 1)
        purged = counter("blobstore_blobnode_trash_purged_bytes_total", disk_id="1")
        await upkeep.purge(now=time.time() + HOUR - 60)  # its hold is not over
        assert trash_of(node) == [name]
        await upkeep.purge(now=time.time() + HOUR)
        assert trash_of(node) == []
        assert counter("blobstore_blobnode_trash_purged_bytes_total", disk_id="1") - purged == stat.trash_bytes
        stat = await node.disk_stat(1)
        assert (stat.trash_files, stat.trash_bytes) == (0, 0)

    asyncio.run(scenario())


def test_a_chunk_mostly_deleted_is_compacted_and_its_old_file_purged_after_the_hold(node: Blobnode) -> None:
    async def scenario() -> None:
        await fill(node, A, 16)  # 4 MiB
        upkeep = DiskUpkeep(node, 1)
        await delete(node, A, range(1, 8))  # 7 of 16: under half, not worth it yet
        await upkeep.compact(now=time.time())
        assert trash_of(node) == []
        await delete(node, A, range(8, 13))  # 12 of 16
        old = await node.chunk_stat(1, A)
        compactions = counter("blobstore_blobnode_compactions_total", disk_id="1", result="ok")
        await upkeep.compact(now=time.time())
        new = await node.chunk_stat(1, A)
        assert new.chunk_id != old.chunk_id and new.punched_bytes == 0 and new.shard_count == 4
        assert new.write_offset < old.write_offset - 11 * SHARD  # the room the deleted shards took is back
        for bid in range(13, 17):  # the live shards read back
            _, _, pieces = await node.open_shard_read(1, A, bid, 0, None)
            assert b"".join([bytes(p) async for p in pieces]) == bytes([bid]) * SHARD
        await node.put_shard(1, A, 17, bytearray(SHARD))  # and it takes writes
        (name,) = trash_of(node)
        assert name.startswith(f"{old.chunk_id}.compacted.")
        assert counter("blobstore_blobnode_compactions_total", disk_id="1", result="ok") == compactions + 1
        await upkeep.purge(now=time.time() + HOUR)
        assert trash_of(node) == []

    asyncio.run(scenario())


def test_the_trash_is_purged_while_background_work_holds_every_slot_and_owes_minutes_of_rate(node: Blobnode) -> None:
    """Removing trash moves no bytes: a disk filling with released chunks gets its space back even while repairs and
    moves (here: every background slot held, ten minutes of the rate owed) keep its background lane busy."""
    async def scenario() -> None:
        await fill(node, A, 12)
        await node.set_chunk_status(1, A, ChunkStatus.RELEASED)
        gate = node.gates[1]
        gate.charge(int(600 * gate.rate))
        with pytest.raises(TimeoutError):  # the lane is truly blocked: a background operation waits out the debt
            await asyncio.wait_for(gate.slot().__aenter__(), 0.2)
        gate.slots = asyncio.Semaphore(0)  # and every slot is taken
        await asyncio.wait_for(DiskUpkeep(node, 1).purge(now=time.time() + HOUR), 5)
        assert trash_of(node) == []

    asyncio.run(scenario())


def test_a_disk_without_its_trash_folder_shows_none_and_makes_it_again(node: Blobnode) -> None:
    async def scenario() -> None:
        await fill(node, A, 2)
        (node.disk(1).path / ".trash").rmdir()
        assert (await node.disk_stat(1)).trash_files == 0
        await node.set_chunk_status(1, A, ChunkStatus.RELEASED)
        assert len(trash_of(node)) == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("node", [{"auto_compact": False}], indirect=True)
def test_auto_compact_off_leaves_chunks_alone(node: Blobnode) -> None:
    async def scenario() -> None:
        await fill(node, A, 4)
        await delete(node, A, range(1, 4))
        before = await node.chunk_stat(1, A)
        await DiskUpkeep(node, 1).compact(now=time.time())
        assert (await node.chunk_stat(1, A)).chunk_id == before.chunk_id and trash_of(node) == []

    asyncio.run(scenario())


def test_reads_go_on_while_a_compaction_copies(node: Blobnode) -> None:
    """A put staged but not yet committed when a compaction begins holds the compaction inside its copy (it waits
    for every pending put of the chunk) until the put commits: meanwhile a read of the unit must not wait."""
    async def scenario() -> None:
        await fill(node, A, 4)
        await delete(node, A, range(1, 3))
        disk = node.disk(1)
        old = (await node.chunk_stat(1, A)).chunk_id
        staged = disk.stage_put(A, 5, bytearray(b"in flight"))
        compaction = asyncio.create_task(asyncio.to_thread(disk.compact_chunk, A))
        try:
            deadline = time.monotonic() + 5
            lock = disk.unit_lock(A)
            while lock.acquire_shared(blocking=False):  # until the compaction waits for the unit, or holds it
                lock.release_shared()
                assert time.monotonic() < deadline, "the compaction never began"
                await asyncio.sleep(0.01)
            _, _, pieces = await asyncio.wait_for(node.open_shard_read(1, A, 3, 0, None), timeout=5)
            assert b"".join([bytes(p) async for p in pieces]) == bytes([3]) * SHARD
            assert not compaction.done()
        finally:
            await asyncio.to_thread(disk.commits.stored, staged)
            await asyncio.wait_for(compaction, timeout=10)
        new = await node.chunk_stat(1, A)
        assert new.chunk_id != old and new.shard_count == 3  # bids 3, 4 and the one in flight

    asyncio.run(scenario())
