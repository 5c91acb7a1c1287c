"""Disk heartbeats committed together (services/clustermgr/beats.py), driven with a recording commit."""

from __future__ import annotations

import asyncio

import pytest

from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.clustermgr import DiskBeat, HeartbeatAnswer
from blobstore_server.libs.rpc.errors import NotLeader
from blobstore_server.services.clustermgr.beats import HeartbeatBatcher
from blobstore_server.services.clustermgr.commands.disks import DiskHeartbeatCmd


def report(*disks: tuple[int, int]) -> DiskHeartbeatCmd:
    return DiskHeartbeatCmd(disks=[DiskBeat(disk_id=d, size=100, free=free) for d, free in disks])


class Recorder:
    def __init__(self, fail: Exception | None = None) -> None:
        self.commands: list[DiskHeartbeatCmd] = []
        self.fail = fail

    async def __call__(self, cmd: DiskHeartbeatCmd) -> HeartbeatAnswer:
        self.commands.append(cmd)
        if self.fail is not None:
            raise self.fail
        return HeartbeatAnswer(statuses=dict.fromkeys((b.disk_id for b in cmd.disks), DiskStatus.NORMAL),
                               write_fence_s=20.0)


def test_reports_within_a_window_are_one_command_and_each_caller_hears_its_own_disks() -> None:
    commit = Recorder()

    async def run() -> list[HeartbeatAnswer]:
        batcher = HeartbeatBatcher(commit, window=0.05)
        return await asyncio.gather(batcher.beat(report((1, 10), (2, 20))), batcher.beat(report((3, 30))),
                                    batcher.beat(report((1, 11))))

    answers = asyncio.run(run())
    assert [list(a.statuses) for a in answers] == [[1, 2], [3], [1]]
    assert len(commit.commands) == 1
    assert {b.disk_id: b.free for b in commit.commands[0].disks} == {1: 11, 2: 20, 3: 30}  # the latest report wins


def test_a_failed_commit_reaches_every_caller_and_the_next_report_starts_a_new_batch() -> None:
    commit = Recorder(fail=NotLeader("clustermgr 2 does not lead"))

    async def run() -> None:
        batcher = HeartbeatBatcher(commit, window=0.01)
        answers = await asyncio.gather(batcher.beat(report((1, 1))), batcher.beat(report((2, 2))),
                                       return_exceptions=True)
        assert all(isinstance(a, NotLeader) for a in answers), answers
        commit.fail = None
        assert list((await batcher.beat(report((2, 3)))).statuses) == [2]

    asyncio.run(run())
    assert [[b.disk_id for b in c.disks] for c in commit.commands] == [[1, 2], [2]]


def test_a_caller_that_goes_away_does_not_stop_the_others() -> None:
    commit = Recorder()

    async def run() -> HeartbeatAnswer:
        batcher = HeartbeatBatcher(commit, window=0.05)
        gone = asyncio.create_task(batcher.beat(report((1, 1))))
        await asyncio.sleep(0.01)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await batcher.beat(report((2, 2)))

    assert list(asyncio.run(run()).statuses) == [2]
    assert [[b.disk_id for b in c.disks] for c in commit.commands] == [[1, 2]]  # its beat was still recorded


def test_window_zero_commits_each_report_alone() -> None:
    commit = Recorder()

    async def run() -> None:
        batcher = HeartbeatBatcher(commit, window=0)
        await asyncio.gather(batcher.beat(report((1, 1))), batcher.beat(report((2, 2))))

    asyncio.run(run())
    assert len(commit.commands) == 2
