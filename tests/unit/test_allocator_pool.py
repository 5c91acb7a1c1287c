from __future__ import annotations

import pytest

from libs.proto.allocator import LeasedVolume
from libs.proto.cluster import VolumeHealth
from services.allocator.pool import BidRanges, PoolEmpty, VolumePool

MODE = 11


def pool_with(*volumes: LeasedVolume, bids: tuple[int, int] = (1, 100)) -> VolumePool:
    pool = VolumePool(lease_margin=2.0)
    for v in volumes:
        pool.add(v)
    pool.bids.add(*bids)
    return pool


def test_allocations_never_overlap_and_respect_capacity() -> None:
    pool = pool_with(LeasedVolume(vid=1, code_mode=MODE, capacity=100, used=0, lease_expiry=50))
    first = pool.allocate(MODE, 60, 10, now=0)
    second = pool.allocate(MODE, 40, 10, now=0)
    assert (first[0].min_bid, first[0].count) == (1, 6)
    assert (second[0].min_bid, second[0].count) == (7, 4)
    with pytest.raises(PoolEmpty, match="has 1 bytes free"):
        pool.allocate(MODE, 1, 10, now=0)


def test_a_volume_near_its_lease_end_is_not_used() -> None:
    pool = pool_with(LeasedVolume(vid=1, code_mode=MODE, capacity=100, used=0, lease_expiry=10))
    assert pool.allocate(MODE, 1, 10, now=7.9)[0].vid == 1
    with pytest.raises(PoolEmpty):
        pool.allocate(MODE, 1, 10, now=8.0)
    pool.renewed(1, 30, VolumeHealth())
    assert pool.allocate(MODE, 1, 10, now=8.0)[0].vid == 1


def test_other_code_modes_and_dropped_volumes_are_not_used() -> None:
    pool = pool_with(LeasedVolume(vid=1, code_mode=13, capacity=100, used=0, lease_expiry=50),
                     LeasedVolume(vid=2, code_mode=MODE, capacity=100, used=0, lease_expiry=50))
    assert pool.allocate(MODE, 5, 10, now=0)[0].vid == 2
    pool.drop(2)
    with pytest.raises(PoolEmpty):
        pool.allocate(MODE, 5, 10, now=0)


def test_refusal_consumes_no_bids_and_zero_size_takes_one_bid() -> None:
    pool = pool_with(LeasedVolume(vid=1, code_mode=MODE, capacity=10, used=0, lease_expiry=50), bids=(5, 6))
    with pytest.raises(PoolEmpty):
        pool.allocate(MODE, 11, 10, now=0)
    assert pool.bids.left == 2
    assert pool.allocate(MODE, 0, 10, now=0)[0].min_bid == 5


def test_bid_runs_are_consecutive_and_skip_short_ranges() -> None:
    bids = BidRanges()
    bids.add(1, 3)
    bids.add(10, 20)
    assert bids.take(2) == 1
    assert bids.take(2) == 10  # bid 3 alone cannot hold a run of two
    assert bids.take(9) == 12
    with pytest.raises(PoolEmpty):
        bids.take(1)
