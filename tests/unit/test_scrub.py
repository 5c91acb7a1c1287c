"""Scrubbing: the pacing rule and the pass's transitions (`services/blobnode/scrub.py`, no I/O), then one disk's
scrubber on a real in-process blobnode: it finds a flipped byte, resumes a pass where its record says, and keeps
a finding until mqproxy (a fake here: only the sender's policy is under test) takes it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from blobstore_server.libs.proto.blobnode import ShardState
from blobstore_server.libs.proto.dashboard import ScrubView
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.mqproxy import Queued, RepairBatch
from blobstore_server.libs.rpc import errors
from blobstore_server.libs.rpc.client import HttpClient, Request
from blobstore_server.libs.rpc.testing import FakeReply, FakeTransport
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.figures import scrub_figures
from blobstore_server.services.blobnode.node import Blobnode
from blobstore_server.services.blobnode.scrub import MAX_OWED, ScrubFinding, ScrubRecord, ScrubState, pause
from blobstore_server.services.blobnode.scrubber import DiskScrubber, Scrubber, load_record
from blobstore_server.services.dashboard.overview import scrub_view
from blobstore_server.services.dashboard.scrape import Scrape
from blobstore_server.services.mqproxy.client import MqProxyClient
from tests.support.damage import flip_in_chunk

MB = 1 << 20
DAY = 86400.0


# the pacing rule


def test_a_pass_is_spread_over_the_period() -> None:
    sizes = [MB] * 100  # 100 MiB stored, a day's period: far below the cap
    assert sum(pause(s, 100 * MB, DAY, 8 * MB) for s in sizes) == pytest.approx(DAY)


def test_the_cap_bounds_the_pace() -> None:
    stored = 100 << 30  # 100 GiB over one hour would be 28 MiB/s: the cap (8 MiB/s) wins
    assert pause(8 * MB, stored, 3600.0, 8 * MB) == pytest.approx(1.0)
    assert sum(pause(64 * MB, stored, 3600.0, 8 * MB) for _ in range(stored // (64 * MB))) == pytest.approx(
        stored / (8 * MB))


def test_a_shard_larger_than_what_was_counted_stored_does_not_stall_the_pass() -> None:
    assert pause(4 * MB, 0, 100.0, 8 * MB) == pytest.approx(100.0)  # read as if the disk held just it


# the pass


def test_a_pass_begins_at_once_then_a_period_after_the_last_began() -> None:
    state = ScrubState(ScrubRecord())
    assert state.wait(now=1000.0, period=60.0) == 0.0
    state.begin(1000.0)
    assert state.wait(now=1000.0, period=60.0) == 0.0  # running
    state.scrubbed(Vuid.make(1, 0, 1), 5, 100, ShardState.PRESENT, 1001.0)
    assert state.progress(stored=400) == 0.25
    state.finish(1010.0)
    assert state.record.last_full_pass == 1010.0 and state.record.passes == 1 and state.progress(400) == 1.0
    assert state.wait(now=1010.0, period=60.0) == 50.0
    assert state.wait(now=2000.0, period=60.0) == 0.0


def test_a_pass_over_an_empty_disk_waits_a_period() -> None:
    state = ScrubState(ScrubRecord())
    state.begin(0.0)
    state.finish(0.0)
    assert state.wait(now=0.0, period=14 * DAY) == 14 * DAY
    stat = state.stat(stored=0, period=14 * DAY)
    assert (stat.passes, stat.shards, stat.progress, stat.last_full_pass) == (1, 0, 1.0, None)


def test_a_restart_resumes_the_pass_at_its_cursor() -> None:
    state = ScrubState(ScrubRecord())
    state.begin(100.0)
    a, b = Vuid.make(1, 2, 1), Vuid.make(2, 0, 1)
    state.scrubbed(a, 7, 10, ShardState.PRESENT, 101.0)
    state.chunk_done(a)
    state.scrubbed(b, 3, 10, ShardState.PRESENT, 102.0)
    again = ScrubState(ScrubRecord.model_validate_json(state.record.model_dump_json()))  # what a restart reads
    assert again.wait(now=1e9, period=60.0) == 0.0
    again.begin(500.0)  # a pass is running: it goes on
    assert (again.record.pass_started, again.record.vuid, again.record.bid) == (100.0, b, 4)
    assert (again.record.pass_shards, again.record.pass_bytes) == (2, 20)


def test_findings_are_owed_once_and_only_for_bad_bytes() -> None:
    state = ScrubState(ScrubRecord())
    state.begin(0.0)
    vuid = Vuid.make(9, 4, 2)
    outcomes = {1: ShardState.PRESENT, 2: ShardState.CORRUPT, 3: ShardState.ERROR, 4: ShardState.DELETED,
                5: ShardState.MISSING, 6: ShardState.MOVED}
    found = {bid: state.scrubbed(vuid, bid, 10, outcome, 1.0) for bid, outcome in outcomes.items()}
    assert {bid: f.reason for bid, f in found.items() if f} == {2: "corrupt", 3: "unreadable"}
    assert (state.record.pass_shards, state.record.corrupt) == (3, 2)  # gone meanwhile: not read, not counted
    state.scrubbed(vuid, 2, 10, ShardState.CORRUPT, 2.0)  # found again before mqproxy took it
    assert [f.bid for f in state.record.owed] == [2, 3]
    repair = state.record.owed[0].repair()
    assert (repair.vid, repair.bid, repair.bad_indexes) == (9, 2, [4])
    state.scrubbed(vuid, 7, 10, ShardState.CORRUPT, 3.0)
    state.queued(state.record.owed[:2])  # found meanwhile: still owed
    assert [f.bid for f in state.record.owed] == [7] and state.record.repairs_queued == 2


def test_too_many_findings_hold_the_pass() -> None:
    state = ScrubState(ScrubRecord(owed=[ScrubFinding(vuid=1 << 32, bid=b, reason="corrupt", found=0.0)
                                         for b in range(MAX_OWED)]))
    assert state.full
    state.queued(state.record.owed[:1])
    assert not state.full


# one disk's scrubber on a real blobnode


def make_node(tmp_path: Path, **config: object) -> Blobnode:
    return Blobnode(BlobnodeConfig(disks=[{"path": str(tmp_path / "d"), "disk_id": 1}], sync=False, **config))


A, B = Vuid.make(1, 0, 1), Vuid.make(2, 3, 1)


async def fill(node: Blobnode) -> None:
    """Two chunks of five 100 KB shards each (two 64 KiB blocks apiece)."""
    for vuid in (A, B):
        await node.create_chunk(1, vuid, None)
        for bid in range(1, 6):
            await node.put_shard(1, vuid, bid, bytearray(bytes([bid]) * 100_000))


async def flip(node: Blobnode, vuid: int, bid: int) -> None:
    meta = await node.shard_stat(1, vuid, bid)
    chunk = next(c for c in await node.list_chunks(1) if c.vuid == vuid)
    flip_in_chunk(node.disk(1).path / "data" / chunk.chunk_id, meta.offset, meta.size)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_the_scrubber_finds_a_flipped_byte_and_keeps_it_across_a_restart(tmp_path: Path) -> None:
    node = make_node(tmp_path, scrub_period=0.5)  # ~1 MB over half a second

    async def scenario() -> None:
        await fill(node)
        await flip(node, B, 4)
        scrub = DiskScrubber(node, 1, asyncio.Event())
        task = asyncio.create_task(scrub.run())
        try:
            await until(lambda: scrub.state.record.passes >= 1)
        finally:
            task.cancel()
        stat = scrub.stat()  # the next pass may have begun: a pass takes its whole period
        assert stat.shards >= 10 and stat.bytes >= 1_000_000 and stat.corrupt >= 1
        assert stat.repairs_owed == 1 and stat.last_full_pass is not None
        assert scrub.owed.is_set()
        kept = load_record(scrub.path)  # what a restart finds
        assert [(f.vuid, f.bid, f.reason) for f in kept.owed] == [(B, 4, "corrupt")]
        assert kept.passes == 1

    try:
        asyncio.run(scenario())
    finally:
        node.close()


def test_a_restarted_scrubber_reads_only_what_its_pass_had_left(tmp_path: Path) -> None:
    node = make_node(tmp_path, scrub_period=0.5)

    async def scenario() -> None:
        await fill(node)
        path = node.disk(1).path / ".sys" / "scrub.json"
        path.write_text(ScrubRecord(running=True, pass_started=time.time(), vuid=B, bid=3, pass_shards=7,
                                    pass_bytes=700_000).model_dump_json())
        scrub = DiskScrubber(node, 1, asyncio.Event())
        task = asyncio.create_task(scrub.run())
        try:
            await until(lambda: scrub.state.record.passes >= 1)
        finally:
            task.cancel()
        record = load_record(path)
        assert (record.shards, record.pass_shards, record.pass_bytes) == (3, 10, 1_000_000)  # bids 3..5 of B

    try:
        asyncio.run(scenario())
    finally:
        node.close()


def test_findings_stay_owed_until_mqproxy_takes_them(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    up = False
    taken: list[RepairBatch] = []

    async def mqproxy(request: Request) -> FakeReply:
        if not up:
            return FakeReply.of(errors.Unavailable("kafka is away"))
        assert request.body is not None
        taken.append(RepairBatch.model_validate_json(bytes(request.body)))
        return FakeReply.of(Queued(queued=len(taken[-1].messages)))

    async def scenario() -> None:
        nonlocal up
        scrub = DiskScrubber(node, 1, asyncio.Event())
        scrub.state.begin(0.0)
        scrub.state.scrubbed(B, 4, 10, ShardState.CORRUPT, 1.0)
        async with MqProxyClient(["http://mq"], http=HttpClient(FakeTransport(mqproxy))) as mq:
            assert not await scrub.send(mq)
            assert [f.bid for f in scrub.state.record.owed] == [4]
            up = True
            assert await scrub.send(mq)
        assert [(m.vid, m.bid, m.bad_indexes) for m in taken[0].messages] == [(2, 4, [3])]
        assert scrub.stat().repairs_queued == 1 and scrub.stat().repairs_owed == 0
        assert load_record(scrub.path).owed == []

    try:
        asyncio.run(scenario())
    finally:
        node.close()


class Figures(Collector):
    """What a blobnode's /metrics says of its scrub."""

    def __init__(self, scrubber: Scrubber) -> None:
        self.scrubber = scrubber

    def collect(self) -> Iterator[Metric]:
        return scrub_figures(self.scrubber)


def test_the_dashboard_shows_a_disks_scrub_from_its_blobnodes_metrics(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    try:
        scrubber = Scrubber(node, None)
        state = scrubber.disks[1].state
        state.begin(1000.0)
        state.scrubbed(B, 4, 10, ShardState.CORRUPT, 1001.0)
        state.finish(1010.0)
        registry = CollectorRegistry()
        registry.register(Figures(scrubber))
        scrape = Scrape.parse(generate_latest(registry).decode(), time=1070.0)
        assert scrub_view(scrape, 1, now=1070.0) == ScrubView(progress=1.0, last_pass_age_s=60.0, corrupt=1,
                                                              repairs_owed=1)
        assert scrub_view(scrape, 2, now=1070.0) is None and scrub_view(None, 1, now=1070.0) is None
    finally:
        node.close()


def test_a_period_of_zero_turns_scrubbing_off(tmp_path: Path) -> None:
    node = make_node(tmp_path, scrub_period=0)
    try:
        assert not Scrubber(node, None).stat(1).enabled
    finally:
        node.close()
