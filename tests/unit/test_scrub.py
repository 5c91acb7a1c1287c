"""Scrubbing: the pacing rule and the pass's transitions (`services/blobnode/scrub.py`, no I/O), then one disk's
scrubber on a real in-process blobnode: it finds a flipped byte, resumes a pass where its record says, and keeps
a finding until mqproxy (a fake here: only the sender's policy is under test) takes it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
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
from blobstore_server.services.blobnode.scrub import (
    MAX_OWED,
    ScrubFinding,
    ScrubPace,
    ScrubRecord,
    ScrubState,
    pause,
    scrub_pace,
)
from blobstore_server.services.blobnode.scrubber import DiskScrubber, Scrubber, load_record
from blobstore_server.services.dashboard.overview import scrub_view
from blobstore_server.services.dashboard.scrape import Scrape
from blobstore_server.services.mqproxy.client import MqProxyClient
from tests.support.damage import flip_in_chunk
from tests.support.waiting import eventually

MB = 1 << 20
DAY = 86400.0


# the pacing rule


def read_pass(stored: int, period: float, cap: float, shard: int = MB, read_seconds: float = 0.0) -> float:
    """Seconds a pass over `stored` bytes of `shard`-byte shards takes, each read taking `read_seconds`."""
    remaining, elapsed = stored, 0.0
    while remaining > 0:
        pace = scrub_pace(remaining, period - elapsed, cap)
        elapsed += read_seconds + pause(shard, pace, spent=read_seconds)
        remaining -= shard
    return elapsed


def test_a_pass_is_spread_over_the_period() -> None:
    assert read_pass(100 * MB, DAY, 8 * MB) == pytest.approx(DAY)  # 100 MiB a day: far below the cap


def test_a_pass_slowed_down_catches_up_within_its_period() -> None:
    # each read itself takes a while (the disk is busy, background I/O yields to users): the rests shrink to fit
    assert read_pass(100 * MB, DAY, 8 * MB, read_seconds=300.0) == pytest.approx(DAY)
    # half the period gone with a quarter read: the rest is read half again as fast as the steady pace
    assert scrub_pace(75 * MB, DAY / 2, 8 * MB).rate == pytest.approx(1.5 * 100 * MB / DAY)


def test_the_cap_bounds_the_pace_and_says_how_late_the_pass_ends() -> None:
    stored = 100 << 30  # 100 GiB over one hour would be 28 MiB/s: the cap (8 MiB/s) wins
    assert scrub_pace(stored, 3600.0, 8 * MB) == ScrubPace(rate=8 * MB, late=stored / (8 * MB) - 3600.0)
    assert read_pass(stored, 3600.0, 8 * MB, shard=64 * MB) == pytest.approx(stored / (8 * MB))
    # the disk: 16 TB at 80 % in a 14-day period at 8 MiB/s takes 17.7 days: 3.7 days late
    assert scrub_pace(int(0.8 * 16e12), 14 * DAY, 8 * MB).late / DAY == pytest.approx(3.66, abs=0.01)


@pytest.mark.parametrize(("remaining", "left", "rate", "late"), [
    (0, DAY, 0.0, 0.0),  # nothing left to read
    (0, -DAY, 0.0, 0.0),  # nothing left, however overdue
    (86400 * MB, DAY, MB, 0.0),  # just what the period allows
    (86400 * MB, 2 * DAY, MB / 2, 0.0),  # ahead of time: slower
    (3 * 86400 * MB, DAY, 2 * MB, DAY / 2),  # half again what the cap reads in the period: half a day late
    (86400 * MB, 0.0, 2 * MB, DAY / 2),  # the period is over: at the cap, and late by the read
    (86400 * MB, -DAY, 2 * MB, DAY / 2 + DAY),  # overdue for a day already: that day too
])
def test_the_pace_table(remaining: int, left: float, rate: float, late: float) -> None:
    assert scrub_pace(remaining, left, cap=2 * MB) == ScrubPace(rate=pytest.approx(rate), late=pytest.approx(late))


def test_a_rest_is_what_the_read_left_of_its_share() -> None:
    assert pause(MB, ScrubPace(rate=MB / 10, late=0.0), spent=4.0) == 6.0
    assert pause(MB, ScrubPace(rate=MB / 10, late=0.0), spent=12.0) == 0.0  # a slow read: no rest at all
    assert pause(0, scrub_pace(MB, 1.0, MB)) == 0.0  # an empty shard
    assert pause(MB, ScrubPace(rate=0.0, late=0.0)) == 0.0  # nothing was left to read


def test_between_passes_the_next_one_is_judged_over_a_whole_period() -> None:
    state = ScrubState(ScrubRecord())
    assert state.pace(30 * DAY * MB, period=14 * DAY, cap=2 * MB, now=0.0) == ScrubPace(rate=2 * MB, late=DAY)
    state.begin(0.0)  # a pass running: judged by what its period has left
    assert state.pace(30 * DAY * MB, period=14 * DAY, cap=2 * MB, now=7 * DAY).late == pytest.approx(8 * DAY)
    stat = state.stat(30 * DAY * MB, period=14 * DAY, cap=2 * MB, now=7 * DAY)
    assert (stat.rate, stat.late_s) == (2 * MB, pytest.approx(8 * DAY))
    off = state.stat(30 * DAY * MB, period=0.0, cap=2 * MB, now=7 * DAY)  # scrubbing off: nothing promised
    assert (off.enabled, off.rate, off.late_s) == (False, 0.0, 0.0)


# the pass


def test_a_pass_begins_at_once_then_a_period_after_the_last_began() -> None:
    state = ScrubState(ScrubRecord())
    assert state.wait(now=1000.0, period=60.0) == 0.0
    state.begin(1000.0)
    assert state.wait(now=1000.0, period=60.0) == 0.0  # running
    state.scrubbed(Vuid.make(1, 0, 1), 5, 100, ShardState.PRESENT, 1001.0)
    assert state.progress(remaining=300) == 0.25
    state.finish(1010.0)
    assert state.record.last_full_pass == 1010.0 and state.record.passes == 1 and state.progress(400) == 1.0
    assert state.wait(now=1010.0, period=60.0) == 50.0
    assert state.wait(now=2000.0, period=60.0) == 0.0


def test_a_pass_over_an_empty_disk_waits_a_period() -> None:
    state = ScrubState(ScrubRecord())
    state.begin(0.0)
    state.finish(0.0)
    assert state.wait(now=0.0, period=14 * DAY) == 14 * DAY
    stat = state.stat(remaining=0, period=14 * DAY, cap=8 * MB, now=0.0)
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


def test_the_scrubber_finds_a_flipped_byte_and_keeps_it_across_a_restart(tmp_path: Path) -> None:
    node = make_node(tmp_path, scrub_period=0.5)  # ~1 MB over half a second

    async def scenario() -> None:
        await fill(node)
        await flip(node, B, 4)
        scrub = DiskScrubber(node, 1, asyncio.Event())
        task = asyncio.create_task(scrub.run())
        try:
            await eventually(lambda: scrub.state.record.passes >= 1, 10, "a whole pass")
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
            await eventually(lambda: scrub.state.record.passes >= 1, 10, "a whole pass")
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


def test_a_disk_its_cap_cannot_cover_in_a_period_says_by_how_much_its_pass_is_late(tmp_path: Path) -> None:
    # 1 MB stored, 1 s per pass, at most 0.25 MiB/s: a pass takes ~3.8 s, ~2.8 s late; the metric says the same
    node = make_node(tmp_path, scrub_period=1.0, scrub_mb_per_sec=0.25)

    async def scenario() -> None:
        await fill(node)
        scrubber = Scrubber(node, None)
        scrub = scrubber.disks[1]
        task = asyncio.create_task(scrub.run())
        try:
            await eventually(lambda: scrub.state.record.pass_shards >= 2, 10, "two shards scrubbed")
        finally:
            task.cancel()
        stat = scrub.stat()
        assert stat.running and stat.rate == 0.25 * MB
        assert 2.0 < stat.late_s < 3.0  # ~0.8 MB left to read at 0.25 MiB/s, with under a second of period left
        registry = CollectorRegistry()
        registry.register(Figures(scrubber))
        text = generate_latest(registry).decode()
        assert 'blobstore_blobnode_scrub_late_seconds{disk_id="1"} 2.' in text
        assert f'blobstore_blobnode_scrub_rate_bytes{{disk_id="1"}} {0.25 * MB}' in text

    try:
        asyncio.run(scenario())
    finally:
        node.close()


def test_a_disk_its_cap_covers_is_on_time(tmp_path: Path) -> None:
    node = make_node(tmp_path, scrub_period=1.0, scrub_mb_per_sec=8)

    async def scenario() -> None:
        await fill(node)
        scrub = Scrubber(node, None).disks[1]
        task = asyncio.create_task(scrub.run())
        try:
            await eventually(lambda: scrub.state.record.pass_shards >= 2, 10, "two shards scrubbed")
        finally:
            task.cancel()
        stat = scrub.stat()  # ~0.8 MB left in under a second: well under the cap
        assert stat.late_s == 0.0 and 0 < stat.rate < 8 * MB

    try:
        asyncio.run(scenario())
    finally:
        node.close()


def test_a_period_of_zero_turns_scrubbing_off(tmp_path: Path) -> None:
    node = make_node(tmp_path, scrub_period=0)
    try:
        assert not Scrubber(node, None).stat(1).enabled
    finally:
        node.close()
