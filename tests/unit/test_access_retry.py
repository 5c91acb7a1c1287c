"""access's retry and punishment decisions, without I/O: where blobs go when writes fail, which units a PUT
skips, what the health table remembers and for how long."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.proto.allocator import BlobSlice
from blobstore_server.libs.proto.location import MAX_SLICES, Location
from blobstore_server.services.access.health import HealthTable
from blobstore_server.services.access.putplan import PutPlan, RetryRefused
from blobstore_server.services.access.quorum import units_to_skip


class Allocator:
    """Hands out one fresh run of bids in a new volume per allocation, as the allocator does."""

    def __init__(self) -> None:
        self.vids = itertools.count(1)
        self.bids = itertools.count(1000, 100)
        self.given: set[tuple[int, int]] = set()

    def alloc(self, blobs: int) -> list[BlobSlice]:
        run = BlobSlice(vid=next(self.vids), min_bid=next(self.bids), count=blobs)
        self.given |= {(run.vid, b) for b in range(run.min_bid, run.min_bid + blobs)}
        return [run]


@settings(max_examples=400, deadline=None)
@given(blobs=st.integers(0, 12), outcomes=st.lists(st.booleans(), max_size=60), tries=st.integers(1, 4))
def test_a_plan_places_every_blob_once_in_order_within_its_budgets(blobs: int, outcomes: list[bool],
                                                                   tries: int) -> None:
    plan = PutPlan(blobs, tries=tries, retry_window=100.0)
    allocator = Allocator()
    if blobs:
        plan.allocated(allocator.alloc(blobs))
    attempts = iter(outcomes)
    placed: list[tuple[int, int]] = []
    for blob in range(blobs):
        for attempt in itertools.count(1):
            target = plan.begin(now=0.0)
            ok = next(attempts, True)
            if ok:
                plan.written()
                placed.append(target)
                break
            try:
                plan.failed(now=0.0)
            except RetryRefused:
                runs = len({vid for vid, _ in placed})  # every allocation is a new volume
                assert attempt == tries or runs + 1 > MAX_SLICES  # refused only when a budget ran out
                return
            assert attempt < tries
            plan.allocated(allocator.alloc(blobs - blob))
    slices = plan.slices()
    location = Location(cluster_id=1, code_mode=CodeMode.EC3P3, size=blobs, blob_size=1, crc=0, blobs=slices)
    assert list(location.blob_ids()) == placed  # each blob where it was really written, in object order
    assert set(placed) <= allocator.given and len(set(placed)) == blobs
    assert len(slices) <= MAX_SLICES


def test_a_retry_keeps_the_written_blobs_and_moves_the_rest() -> None:
    plan = PutPlan(4, tries=3, retry_window=10.0)
    plan.allocated([BlobSlice(vid=7, min_bid=100, count=4)])
    assert plan.begin(0.0) == (7, 100)
    plan.written()
    assert plan.begin(0.0) == (7, 101)
    plan.failed(1.0)
    with pytest.raises(ValueError, match="holds 4 blobs; 3 are left"):
        plan.allocated([BlobSlice(vid=8, min_bid=500, count=4)])
    plan.allocated([BlobSlice(vid=8, min_bid=500, count=3)])
    for _ in range(3):
        plan.begin(2.0)
        plan.written()
    assert [(s.vid, s.min_bid, s.count) for s in plan.slices()] == [(7, 100, 1), (8, 500, 3)]


def test_a_blob_is_not_retried_past_its_tries_or_window() -> None:
    plan = PutPlan(1, tries=3, retry_window=5.0)
    plan.allocated([BlobSlice(vid=1, min_bid=1, count=1)])
    plan.begin(0.0)
    plan.failed(0.1)
    plan.allocated([BlobSlice(vid=2, min_bid=2, count=1)])
    plan.begin(4.0)
    with pytest.raises(RetryRefused, match=r"failed for 5\.0 s"):
        plan.failed(5.0)
    plan = PutPlan(1, tries=2, retry_window=5.0)
    plan.allocated([BlobSlice(vid=1, min_bid=1, count=1)])
    plan.begin(0.0)
    plan.failed(0.0)
    plan.allocated([BlobSlice(vid=2, min_bid=2, count=1)])
    plan.begin(0.0)
    with pytest.raises(RetryRefused, match="failed 2 tries"):
        plan.failed(0.0)


def test_an_object_never_needs_more_than_four_slices() -> None:
    plan = PutPlan(6, tries=3, retry_window=5.0)
    plan.allocated([BlobSlice(vid=1, min_bid=10, count=6)])
    for blob in range(4):  # each blob written, then the next one fails once and moves to a new volume
        plan.begin(0.0)
        plan.written()
        plan.begin(0.0)
        if blob == 3:
            with pytest.raises(RetryRefused, match="more than 4 slices"):
                plan.failed(0.0)
            return
        plan.failed(0.0)
        plan.allocated([BlobSlice(vid=blob + 2, min_bid=100 * (blob + 2), count=5 - blob)])


def test_punished_units_are_skipped_only_while_the_quorum_allows() -> None:
    ec3p3 = tactic(CodeMode.EC3P3)
    assert units_to_skip(ec3p3, set()) == frozenset()
    assert units_to_skip(ec3p3, {4}) == {4}
    assert units_to_skip(ec3p3, {1, 4}) == frozenset()  # 4 of 6 cannot make the quorum: try them all
    ec6p6 = tactic(CodeMode.EC6P6)  # three AZs: a whole AZ may be skipped
    assert units_to_skip(ec6p6, {0, ec6p6.total - 1}) == frozenset()  # two AZs short of the quorum
    az0 = {i for i in range(ec6p6.total) if ec6p6.unit_az(i) == 0}
    assert units_to_skip(ec6p6, az0) == az0
    assert units_to_skip(ec6p6, az0 | {next(i for i in range(ec6p6.total) if ec6p6.unit_az(i) == 1)}) == frozenset()


def test_punishment_lasts_its_period_and_one_success_ends_it() -> None:
    health = HealthTable(disk_punish=10.0, volume_punish=30.0, slow_after=0.5)
    health.failed(3, now=100.0)
    health.punish_volume(9, now=100.0)
    assert health.punished(3, 105.0) and health.read_last(3, 105.0)
    assert health.avoided_disks(105.0) == [3] and health.excluded_volumes(105.0) == [9]
    assert not health.punished(3, 110.0) and health.avoided_disks(110.0) == []
    assert health.excluded_volumes(129.9) == [9] and health.excluded_volumes(130.0) == []
    health.failed(3, now=200.0)
    health.succeeded(3, now=201.0)  # the node is back: used again at once
    assert not health.punished(3, 201.0) and health.avoided_disks(201.0) == []


def test_a_slow_disk_is_read_last_but_still_written() -> None:
    health = HealthTable(disk_punish=10.0, volume_punish=30.0, slow_after=0.5)
    health.succeeded(4, now=100.0, read_latency=0.8)
    assert health.read_last(4, 101.0) and not health.punished(4, 101.0)
    health.succeeded(4, now=101.5)  # a write, however slow, says nothing of reads
    assert health.read_last(4, 101.5)
    health.succeeded(4, now=102.0, read_latency=0.1)
    assert not health.read_last(4, 102.0)
    health.slow(5, now=100.0)  # a read that was hedged past
    assert health.read_last(5, 109.0) and not health.read_last(5, 110.0)
