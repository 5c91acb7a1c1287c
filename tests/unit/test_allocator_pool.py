from __future__ import annotations

import pytest

from blobstore_server.libs import space
from blobstore_server.libs.proto.allocator import LeasedVolume
from blobstore_server.libs.proto.cluster import VolumeHealth
from blobstore_server.services.allocator.pool import BidRanges, PoolEmpty, VolumePool

MODE = 11
PAGE = 4096  # what a blob of up to 6 KiB takes on each unit of an EC3P3 volume (libs/space.py)


def pool_with(*volumes: LeasedVolume, bids: tuple[int, int] = (1, 100)) -> VolumePool:
    pool = VolumePool(lease_margin=2.0)
    for v in volumes:
        pool.add(v)
    pool.bids.add(*bids)
    return pool


def test_allocations_never_overlap_and_respect_capacity() -> None:
    """Each blob is charged the page its shard takes on a unit, whatever its few bytes."""
    pool = pool_with(LeasedVolume(vid=1, code_mode=MODE, capacity=10 * PAGE, used=0, lease_until=50))
    first = pool.allocate(MODE, 60, 10, now=0)
    second = pool.allocate(MODE, 40, 10, now=0)
    assert (first[0].min_bid, first[0].count) == (1, 6)
    assert (second[0].min_bid, second[0].count) == (7, 4)
    assert pool.volumes[1].used == 10 * PAGE
    with pytest.raises(PoolEmpty, match=f"has {PAGE} bytes free for 1 bytes"):
        pool.allocate(MODE, 1, 10, now=0)


def test_a_volume_near_its_lease_end_is_not_used() -> None:
    pool = pool_with(LeasedVolume(vid=1, code_mode=MODE, capacity=100 * PAGE, used=0, lease_until=10))
    assert pool.allocate(MODE, 1, 10, now=7.9)[0].vid == 1
    with pytest.raises(PoolEmpty):
        pool.allocate(MODE, 1, 10, now=8.0)
    pool.renewed(1, 30, VolumeHealth())
    assert pool.allocate(MODE, 1, 10, now=8.0)[0].vid == 1


def test_other_code_modes_and_dropped_volumes_are_not_used() -> None:
    pool = pool_with(LeasedVolume(vid=1, code_mode=13, capacity=100 * PAGE, used=0, lease_until=50),
                     LeasedVolume(vid=2, code_mode=MODE, capacity=100 * PAGE, used=0, lease_until=50))
    assert pool.allocate(MODE, 5, 10, now=0)[0].vid == 2
    pool.drop(2)
    with pytest.raises(PoolEmpty):
        pool.allocate(MODE, 5, 10, now=0)


def test_refusal_consumes_no_bids_and_zero_size_takes_one_bid() -> None:
    pool = pool_with(LeasedVolume(vid=1, code_mode=MODE, capacity=PAGE, used=0, lease_until=50), bids=(5, 6))
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


def leased(vid: int, disks: list[int], hosts: list[str] | None = None, free: int = 100 * PAGE,
           down: list[int] | None = None) -> LeasedVolume:
    hosts = hosts or [f"h{d}" for d in disks]
    return LeasedVolume(vid=vid, code_mode=MODE, capacity=free, used=0, lease_until=50, disks=disks, hosts=hosts,
                        under_spread=len(set(hosts)) < len(hosts), writable=not down, down_units=down or [])


def test_access_exclusions_and_avoided_disks_steer_the_choice() -> None:
    pool = pool_with(leased(1, [1, 2, 3, 4, 5, 6], free=300 * PAGE), leased(2, [3, 4, 5, 6, 7, 8], free=200 * PAGE),
                     leased(3, [1, 2, 5, 6, 7, 8], free=100 * PAGE))
    assert pool.allocate(MODE, 1, 10, now=0)[0].vid == 1  # the most room
    assert pool.allocate(MODE, 1, 10, now=0, exclude_vids={1})[0].vid == 2
    assert pool.allocate(MODE, 1, 10, now=0, avoid_disks={1})[0].vid == 2  # 1 and 3 would miss a unit
    assert pool.allocate(MODE, 1, 10, now=0, avoid_disks={1, 3})[0].vid == 2  # 2 and 3 miss one: room decides
    assert pool.allocate(MODE, 1, 10, now=0, avoid_disks={3, 4})[0].vid == 3  # 1 and 2 would miss two
    with pytest.raises(PoolEmpty, match="that access may use"):
        pool.allocate(MODE, 1, 10, now=0, exclude_vids={3}, avoid_disks={3, 4})
    left = pool.bids.left
    with pytest.raises(PoolEmpty):
        pool.allocate(MODE, 1, 10, now=0, exclude_vids={1, 2, 3})
    assert pool.bids.left == left


def test_unwritable_volumes_are_the_fallback_within_the_slack() -> None:
    pool = pool_with(leased(1, [1, 2, 3, 4, 5, 6], free=300 * PAGE, down=[0]),
                     leased(2, [2, 3, 4, 5, 6, 7], free=100 * PAGE))
    assert pool.allocate(MODE, 1, 10, now=0)[0].vid == 2
    pool.renewed(2, 50, VolumeHealth(writable=False, why_not="unit 5: disk 7 is broken", down_units=[4, 5]))
    assert pool.allocate(MODE, 1, 10, now=0)[0].vid == 1  # one unit down is within EC3P3's slack of one
    pool.renewed(1, 50, VolumeHealth(writable=False, down_units=[0, 1]))
    with pytest.raises(PoolEmpty):
        pool.allocate(MODE, 1, 10, now=0)
    pool.renewed(2, 50, VolumeHealth())  # its disks came back
    assert pool.allocate(MODE, 1, 10, now=0)[0].vid == 2


def test_more_volumes_are_wanted_until_any_one_host_can_be_lost_or_twice_the_target_are_held() -> None:
    pool = pool_with(leased(1, [1, 2, 3, 4, 5, 6]), leased(2, [1, 2, 3, 4, 5, 7], down=[5]))
    assert pool.wanted(MODE, now=0, target=2) == 1  # volume 2 has a unit down
    pool.add(leased(3, [2, 3, 4, 5, 6, 7]))
    assert pool.wanted(MODE, now=0, target=2) == 0
    doubled = ["h1", "h1", "h2", "h3", "h4", "h5"]  # five hosts: each volume has two units on one of them
    pool = pool_with(leased(1, [1, 2, 3, 4, 5, 6], doubled), leased(2, [7, 8, 9, 10, 11, 12], doubled))
    assert pool.wanted(MODE, now=0, target=2) == 1  # losing h1 would leave no volume its quorum
    pool.add(leased(3, [1, 3, 4, 5, 6, 7], ["h2", "h2", "h1", "h3", "h4", "h5"]))
    assert pool.wanted(MODE, now=0, target=2) == 0
    pool = pool_with(*(leased(vid, [1, 2, 3, 4, 5, 6], doubled) for vid in (1, 2, 3)))
    assert pool.wanted(MODE, now=0, target=2) == 1
    pool.add(leased(4, [1, 2, 3, 4, 5, 6], doubled))
    assert pool.wanted(MODE, now=0, target=2) == 0  # twice the target: on five hosts no lease would help


def test_a_returning_host_gets_writes_again_over_volumes_made_without_it() -> None:
    """Volumes created while a host was down double up on the others; once it is back, the
    well-spread volumes it is part of come first again, even with less room."""
    pool = pool_with(leased(1, [1, 2, 3, 4, 5, 6], free=100 * PAGE, down=[5]),
                     leased(2, [1, 2, 3, 4, 5, 7], ["h1", "h2", "h3", "h4", "h5", "h1"], free=300 * PAGE))
    assert pool.allocate(MODE, 1, 10, now=0)[0].vid == 2  # host 6 is down: the under-spread volume
    pool.renewed(1, 50, VolumeHealth())  # host 6 is back
    assert pool.allocate(MODE, 1, 10, now=0)[0].vid == 1


def test_a_reservation_takes_its_bids_and_gets_unused_space_back() -> None:
    """A reservation of 16 bids is charged what 16 objects sharing its bytes could take at most; what comes back
    unused (bytes and bids) is refunded by the same bound."""
    pool = pool_with(LeasedVolume(vid=1, code_mode=MODE, capacity=100 * PAGE, used=0, lease_until=50))
    reserved = pool.allocate(MODE, 40, 10, now=0, bids=16)
    assert (reserved[0].min_bid, reserved[0].count) == (1, 16)  # more bids than blobs of 40 bytes
    charged = pool.volumes[1].used
    assert 16 * PAGE < charged < 17 * PAGE
    pool.give_back(1, 25, 10)  # 15 bytes in 6 objects used: 6 pages on each unit
    pool.give_back(7, 10, 1)  # not leased here: nothing to fix
    assert 6 * PAGE <= pool.volumes[1].used == charged - space.refund(MODE, 25, 10) < 7 * PAGE
    pool.give_back(1, 1000, 100)
    assert pool.volumes[1].used == 0
