"""The blobnode's fences (services/blobnode/fence.py, applied by disk.py): a chunk state change sent under a
scheduler epoch older than the newest a disk has seen changes nothing, whatever the disk went through since
(a restart included); a chunk filled by a task takes destructive calls only under its current task token, and
none once its fence closed (the chunk is live), while a call without a token (a repair of a live unit) works
where no task fills the chunk."""

from __future__ import annotations

import asyncio
import threading
from itertools import product
from pathlib import Path

import pytest

from blobstore_server.libs.chunkfile import ShardStatus
from blobstore_server.libs.proto.blobnode import ChunkInfo, ChunkStatus, TaskFence
from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.clustermgr import HeartbeatAnswer
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import errors
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.fence import (
    WriteFence,
    check_scheduler_epoch,
    check_task_token,
    fenced_for_task,
)
from blobstore_server.services.blobnode.node import Blobnode, ShardRead
from tests.support.damage import flip_in_chunk

VUID = Vuid.make(9, 2, 3)


def record(fence: TaskFence = TaskFence.NONE, token: int = 0) -> ChunkInfo:
    return ChunkInfo(chunk_id="c", vuid=VUID, status=ChunkStatus.NORMAL, chunk_size=1 << 20, created=0.0,
                     task_fence=fence, task_token=token)


def test_an_older_scheduler_epoch_is_refused_an_equal_or_newer_one_taken() -> None:
    for highest, epoch in product(range(4), range(1, 5)):
        if epoch < highest:
            with pytest.raises(errors.Fenced, match=f"epoch {epoch} is superseded: disk 7 has seen epoch {highest}"):
                check_scheduler_epoch(highest, epoch, 7)
        else:
            check_scheduler_epoch(highest, epoch, 7)


def test_every_fence_state_and_token_takes_exactly_the_calls_it_should() -> None:
    """Every state against no token, the current one, an older and a newer one."""
    for fence, current in product(TaskFence, (0, 1, 5)):
        chunk = record(fence, current)
        for token in (None, current + 1, *(t for t in (current, current - 1) if t >= 1)):
            takes = (fence is TaskFence.OPEN and token == current) or (fence is not TaskFence.OPEN and token is None)
            if takes:
                check_task_token(chunk, token)
            else:
                with pytest.raises(errors.Fenced, match="refused"):
                    check_task_token(chunk, token)


def test_a_fence_opens_at_ever_newer_tokens_and_once_closed_stays_closed() -> None:
    opened = fenced_for_task(record(TaskFence.READY), 1)
    assert (opened.task_fence, opened.task_token) == (TaskFence.OPEN, 1)
    assert fenced_for_task(opened, 1) == opened  # the same hand-out asked again
    reopened = fenced_for_task(opened, 4)
    assert reopened.task_token == 4
    with pytest.raises(errors.Conflict, match="task token 3 is older than the chunk's 4") as late:
        fenced_for_task(reopened, 3)  # a hand-out given up on, whose request came late
    assert not isinstance(late.value, errors.Fenced)  # the scheduler is not superseded for it
    closed = fenced_for_task(reopened, None)
    assert (closed.task_fence, closed.task_token) == (TaskFence.CLOSED, 4)
    assert fenced_for_task(closed, None) is closed
    for token in (4, 5, 100):
        with pytest.raises(errors.Conflict, match="is live: its task fence closed at token 4"):
            fenced_for_task(closed, token)
    assert fenced_for_task(record(), None).task_fence is TaskFence.CLOSED  # a unit switched to without a hand-out


def test_a_volumes_own_unit_never_opens_its_fence() -> None:
    """Clustermgr creates a volume's units (no scheduler epoch): live from the start, they never become a task's
    destination, so whoever holds the scheduler's keys (its epoch, its discard tickets) cannot open one to discard
    its shards."""
    for token in (1, 2, 100):
        with pytest.raises(errors.Conflict, match="is a volume's unit, not a task's destination"):
            fenced_for_task(record(), token)


def make_node(tmp_path: Path) -> Blobnode:
    return Blobnode(BlobnodeConfig(disks=[{"path": str(tmp_path / "d1"), "disk_id": 1}]))


def answer(fence: float = 20.0, **statuses: DiskStatus) -> HeartbeatAnswer:
    return HeartbeatAnswer(statuses={int(d[1:]): s for d, s in statuses.items()}, write_fence_s=fence)


def test_the_write_fence_opens_only_from_an_answered_beat_and_shuts_its_fence_after_sending_it() -> None:
    fence = WriteFence(guarded=True)
    refused = fence.refusal(1, 0.0)
    assert refused is not None and "no heartbeat answered yet" in str(refused)  # a restart takes nothing at first
    fence.answered(10.0, answer(d1=DiskStatus.NORMAL, d2=DiskStatus.BROKEN))
    assert fence.refusal(1, 29.9) is None
    assert "past its write fence" in str(fence.refusal(1, 30.0))  # measured from sending the beat, not its answer
    assert "clustermgr has it broken" in str(fence.refusal(2, 11.0))
    assert "unknown" in str(fence.refusal(3, 11.0))  # a disk the answer does not name
    fence.answered(40.0, answer(5.0, d1=DiskStatus.NORMAL))
    assert fence.refusal(1, 44.9) is None and fence.refusal(1, 45.0) is not None  # a shorter fence stands at once
    for status in DiskStatus:
        fence.answered(50.0, answer(d1=status))
        assert (fence.refusal(1, 51.0) is None) is (status in (DiskStatus.NORMAL, DiskStatus.DROPPING)), status
    assert WriteFence(guarded=False).refusal(1, 1e9) is None  # no clustermgr: nobody repairs its disks elsewhere


def test_a_guarded_node_refuses_shard_writes_until_clustermgr_answers(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = make_node(tmp_path)
        node.write_fence.guarded = True
        try:
            await node.create_chunk(1, VUID, None)
            with pytest.raises(errors.WriteFenced):
                await node.put_shard(1, VUID, 1, memoryview(b"x" * 100))
            node.write_fence.answered(asyncio.get_running_loop().time(), answer(d1=DiskStatus.NORMAL))
            assert (await node.put_shard(1, VUID, 1, memoryview(b"x" * 100))).size == 100
            assert (await node.put_shard(1, VUID, 2, memoryview(b"y" * (1 << 20)))).size == 1 << 20  # threaded
            node.write_fence.answered(asyncio.get_running_loop().time(), answer(d1=DiskStatus.REPAIRING))
            with pytest.raises(errors.WriteFenced, match="repairing"):
                await node.put_shard(1, VUID, 3, memoryview(b"z" * 100))
            assert [m.bid for m in await node.list_shards(1, VUID, 0, None, None)] == [1, 2]
        finally:
            node.close()

    asyncio.run(scenario())


def test_a_disk_remembers_the_newest_scheduler_epoch_across_a_restart(tmp_path: Path) -> None:
    async def before_restart(node: Blobnode) -> None:
        await node.create_chunk(1, VUID, None, scheduler_epoch=3)
        await node.set_chunk_status(1, VUID, ChunkStatus.READONLY, scheduler_epoch=4)
        with pytest.raises(errors.Fenced, match="epoch 3 is superseded"):
            await node.set_chunk_status(1, VUID, ChunkStatus.NORMAL, scheduler_epoch=3)

    async def after_restart(node: Blobnode) -> None:
        assert (await node.disk_stat(1)).scheduler_epoch == 4
        for change in (node.set_chunk_status(1, VUID, ChunkStatus.NORMAL, scheduler_epoch=3),
                       node.set_chunk_status(1, VUID, ChunkStatus.RELEASED, scheduler_epoch=2),
                       node.set_task_fence(1, VUID, 1, 1), node.create_chunk(1, Vuid.make(9, 3, 2), None, 3)):
            with pytest.raises(errors.Fenced):
                await change
        assert [(c.vuid, c.status) for c in await node.list_chunks(1)] == [(VUID, ChunkStatus.READONLY)]
        # clustermgr's calls carry no epoch (a volume it creates or rolls back): taken as before; its unit's task
        # fence never opens
        created = await node.create_chunk(1, Vuid.make(10, 0, 1), None)
        assert created.task_fence is TaskFence.NONE
        with pytest.raises(errors.Conflict, match="not a task's destination"):
            await node.set_task_fence(1, Vuid.make(10, 0, 1), 5, 1)
        await node.set_chunk_status(1, Vuid.make(10, 0, 1), ChunkStatus.RELEASED)
        reopened = await node.set_chunk_status(1, VUID, ChunkStatus.NORMAL, scheduler_epoch=5)
        assert reopened.status is ChunkStatus.NORMAL
        assert (await node.disk_stat(1)).scheduler_epoch == 5

    for scenario in (before_restart, after_restart):
        node = make_node(tmp_path)
        try:
            asyncio.run(scenario(node))
        finally:
            node.close()


def test_a_task_fence_guards_discards_and_survives_compaction_and_restart(tmp_path: Path) -> None:
    async def filling(node: Blobnode) -> None:
        await node.create_chunk(1, VUID, None, scheduler_epoch=1)
        for bid in range(1, 6):
            await node.put_shard(1, VUID, bid, memoryview(b"shard %d" % bid))
        await node.discard_shard(1, VUID, 1)  # no task fills it yet: a repair's discard works
        with pytest.raises(errors.Fenced, match="filled by no task"):
            await node.discard_shard(1, VUID, 2, task_token=1)
        await node.set_task_fence(1, VUID, 1, 1)
        await node.set_task_fence(1, VUID, 1, 2)  # handed out again
        with pytest.raises(errors.Fenced, match=r"task token 1 is not the one .* being filled under \(2\)"):
            await node.discard_shard(1, VUID, 2, task_token=1)
        with pytest.raises(errors.Fenced, match="without a task token"):
            await node.discard_shard(1, VUID, 2)
        await node.discard_shard(1, VUID, 2, task_token=2)
        await node.compact_chunk(1, VUID)
        assert (await node.chunk_stat(1, VUID)).task_token == 2

    async def live(node: Blobnode) -> None:
        stat = await node.chunk_stat(1, VUID)
        assert (stat.task_fence, stat.task_token, stat.shard_count) == (TaskFence.OPEN, 2, 3)
        await node.set_task_fence(1, VUID, 1, None)  # before the switch: the chunk becomes the live unit
        for token in (1, 2, 3):
            with pytest.raises(errors.Fenced, match="is live: its task fence closed"):
                await node.discard_shard(1, VUID, 3, task_token=token)
        with pytest.raises(errors.Conflict, match="is live"):
            await node.set_task_fence(1, VUID, 1, 3)
        await node.discard_shard(1, VUID, 3)  # a repair of the live unit
        assert [m.bid for m in await node.list_shards(1, VUID, 0, None, None)] == [4, 5]

    for scenario in (filling, live):
        node = make_node(tmp_path)
        try:
            asyncio.run(scenario(node))
        finally:
            node.close()


def test_a_discard_without_a_tasks_ticket_takes_only_a_shard_failing_its_checksums(tmp_path: Path) -> None:
    """What a blobnode with auth does with a discard carrying no task token (a repair's, or a stolen key's): an
    intact shard stays as it was, normal or marked; a rotten one goes (it is lost already); a missing one is 404."""
    async def scenario(node: Blobnode) -> None:
        await node.create_chunk(1, VUID, None)
        for bid in (1, 2, 3):
            await node.put_shard(1, VUID, bid, memoryview(b"shard %d" % bid * 1000))
        await node.set_shard_status(1, VUID, 2, ShardStatus.MARK_DELETED)
        for bid in (1, 2):
            with pytest.raises(errors.TicketRefused, match=f"bid {bid} of unit {int(VUID)} reads intact"):
                await node.discard_shard(1, VUID, bid, corrupt_only=True)
        chunk = (await node.list_chunks(1))[0]
        rotten = await node.shard_stat(1, VUID, 3)
        flip_in_chunk(tmp_path / "d1" / "data" / chunk.chunk_id, rotten.offset, rotten.size)
        await node.discard_shard(1, VUID, 3, corrupt_only=True)
        assert [(m.bid, m.status) for m in await node.list_shards(1, VUID, 0, None, None)] == [
            (1, ShardStatus.NORMAL), (2, ShardStatus.MARK_DELETED)]
        assert [bytes(r) for r in await node.read_shards([ShardRead(1, VUID, 1, 0, 7000)])] == [b"shard 1" * 1000]
        with pytest.raises(errors.ShardNotFound):
            await node.discard_shard(1, VUID, 3, corrupt_only=True)

    node = make_node(tmp_path)
    try:
        asyncio.run(scenario(node))
    finally:
        node.close()


def test_closing_a_fence_waits_for_the_discards_it_lets_through(tmp_path: Path) -> None:
    """A discard checked against the open fence runs before the close returns, never after: the chunk's unit
    lock, which every discard holds shared, is taken alone by a fence change."""
    node = make_node(tmp_path)
    try:
        async def scenario() -> None:
            await node.create_chunk(1, VUID, None, scheduler_epoch=1)
            await node.put_shard(1, VUID, 1, memoryview(b"x"))
            await node.set_task_fence(1, VUID, 1, 1)
            disk = node.disk(1)
            lock = disk.unit_lock(VUID)
            lock.acquire_shared()  # a discard under way, past its check
            closed = threading.Event()
            closing = asyncio.get_running_loop().run_in_executor(
                None, lambda: (disk.set_task_fence(VUID, None), closed.set()))
            await asyncio.sleep(0.2)
            assert not closed.is_set()
            lock.release_shared()
            await closing
            assert disk.list_chunks()[0].task_fence is TaskFence.CLOSED

        asyncio.run(scenario())
    finally:
        node.close()
