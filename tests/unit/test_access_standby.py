"""The stock access holds to ride out an allocator outage: how big, when refilled, what a PUT may take from it."""

from __future__ import annotations

import itertools

import pytest

from blobstore_server.libs.proto.allocator import BlobSlice, UnusedSpace
from blobstore_server.services.access.standby import RateMeter, Standby, Want

MODE = 11
MiB = 1 << 20


def any_unit(units: frozenset[int]) -> bool:
    """A put quorum that one reachable unit makes."""
    return bool(units)


def standby(ride_out: float = 30.0) -> Standby:
    return Standby(ride_out=ride_out, headroom=2.0, min_bids=100, min_bytes=10 * MiB, max_bids=10_000,
                   max_bytes=1000 * MiB)


def grant(stock: Standby, vid: int, bids: int = 100, size: int = 10 * MiB, usable_for: float = 55.0,
          disks: tuple[int, ...] = (), at: float = 0.0, first: int = 1000) -> None:
    stock.add(MODE, BlobSlice(vid=vid, min_bid=first, count=bids, usable_for=usable_for), size, disks or (vid,), at)


def test_the_rate_is_the_higher_of_a_short_and_a_long_window() -> None:
    meter = RateMeter()
    for second in range(60):
        meter.record(MODE, 1, 1000, float(second))  # 1 object/s for a minute
    assert meter.rate(MODE, 60.0) == pytest.approx((1.0, 1000.0))
    for tick in range(100):
        meter.record(MODE, 1, 1000, 60.0 + tick / 20)  # then 20/s for 5 s: the 10 s window sees it at once
    assert meter.rate(MODE, 65.0)[0] == pytest.approx((100 + 5) / 10)
    fresh = RateMeter()
    for tick in range(60):
        fresh.record(MODE, 1, 1000, tick / 20)  # a stream that began 3 s ago, 20/s: not 6/s
    assert fresh.rate(MODE, 3.0)[0] == pytest.approx(20.0)
    fresh.record(13, 1, 1000, 3.0)
    assert fresh.rate(13, 3.2) == (1.0, 1000.0)  # one PUT is no burst of thousands per second
    assert meter.rate(MODE, 200.0) == (0.0, 0.0) and meter.modes(200.0) == []  # all forgotten
    assert meter.rate(12, 0.0) == (0.0, 0.0)


def test_each_grant_carries_half_the_ride_out_with_headroom_within_bounds() -> None:
    stock = standby()
    assert stock.share(MODE, 0.0) == (100, 10 * MiB)  # idle: the minimum
    for tick in range(600):
        stock.record(MODE, 1, 64 << 10, tick / 10)  # 10 objects of 64 KiB per second
    bids, size = stock.share(MODE, 60.0)
    assert bids == 300 and size == 300 * (64 << 10)  # 30 s x 10/s x 2 headroom / 2 grants
    for tick in range(6000):
        stock.record(MODE, 4, 16 * MiB, 60 + tick / 100)
    assert stock.share(MODE, 120.0) == (10_000, 1000 * MiB)  # capped


def test_two_grants_are_wanted_in_distinct_volumes_and_kept_while_good() -> None:
    stock = standby()
    assert stock.wanted([MODE], 0.0) == [Want(MODE, 100, 10 * MiB, frozenset())] * 2
    grant(stock, vid=1)
    assert stock.wanted([MODE], 1.0) == [Want(MODE, 100, 10 * MiB, frozenset({1}))]
    grant(stock, vid=2, at=1.0)
    assert stock.wanted([MODE], 2.0) == []
    assert stock.wanted([MODE], 25.0) == []  # vid 1 can be written for 30 s more
    assert stock.wanted([MODE], 25.5) == [Want(MODE, 100, 10 * MiB, frozenset({2}))]  # no longer
    grant(stock, vid=3, at=25.5)  # vid 1 is no longer good: its bytes go back to the allocator
    assert stock.returned() == [UnusedSpace(vid=1, size=10 * MiB, bids=100)]
    assert stock.wanted([MODE], 26.0) == []


def test_a_grant_used_past_half_is_replaced_before_it_runs_out() -> None:
    stock = standby()
    grant(stock, vid=1)
    grant(stock, vid=2)
    for _ in range(50):
        assert stock.take(MODE, 1000, 1, 1.0, (), (), any_unit) is not None
    assert stock.wanted([MODE], 1.0) == []  # both still hold half a share
    assert stock.take(MODE, 1000, 1, 1.0, (), (), any_unit) is not None
    assert [w.exclude_vids for w in stock.wanted([MODE], 1.0)] == [frozenset({2})]


def test_nothing_is_wanted_when_turned_off() -> None:
    assert standby(ride_out=0).wanted([MODE], 0.0) == []


def test_modes_in_use_are_stocked_besides_the_ones_asked_for() -> None:
    stock = standby()
    stock.record(12, 1, 100, 0.0)
    assert {w.mode for w in stock.wanted([MODE], 1.0)} == {MODE, 12}


def test_an_object_takes_consecutive_bids_from_the_grant_nearest_its_end() -> None:
    stock = standby()
    grant(stock, vid=1, usable_for=50.0, first=1000)
    grant(stock, vid=2, usable_for=40.0, first=5000)
    assert stock.take(MODE, 3 * MiB, 3, 10.0, (), (), any_unit) == BlobSlice(vid=2, min_bid=5000, count=3,
                                                                             usable_for=30.0)
    assert stock.take(MODE, 1, 1, 10.0, (), (), any_unit) == BlobSlice(vid=2, min_bid=5003, count=1, usable_for=30.0)
    assert stock.held(10.0) == {MODE: (196, 20 * MiB - 3 * MiB - 1, 40.0)}


def test_excluded_volumes_are_skipped_not_dropped_and_avoided_disks_taken_only_as_a_last_resort() -> None:
    stock = standby()
    grant(stock, vid=1, disks=(11, 12), usable_for=40.0)
    grant(stock, vid=2, disks=(21, 22), usable_for=50.0)
    assert stock.take(MODE, 1, 1, 0.0, [1], (), any_unit).vid == 2  # type: ignore[union-attr]
    assert stock.take(MODE, 1, 1, 0.0, (), [12], any_unit).vid == 2  # type: ignore[union-attr]
    # every grant touches a punished disk: the write skips that disk's shard, so the PUT still goes on
    assert stock.take(MODE, 1, 1, 0.0, (), [21, 12], any_unit).vid == 1  # type: ignore[union-attr]
    assert stock.take(MODE, 1, 1, 0.0, (), [11, 12, 21], any_unit).vid == 2  # type: ignore[union-attr]
    # ... but not where the units left could not make the quorum: that write would only wait out its timeouts
    assert stock.take(MODE, 1, 1, 0.0, (), [21, 12], lambda units: len(units) >= 2) is None
    assert stock.take(MODE, 1, 1, 0.0, [1, 2], [21, 12], any_unit) is None
    assert stock.take(MODE, 1, 1, 0.0, (), (), any_unit).vid == 1  # type: ignore[union-attr]


def test_nothing_is_written_after_a_grant_ends_and_its_bytes_go_back() -> None:
    stock = standby()
    grant(stock, vid=1, usable_for=40.0)
    assert stock.take(MODE, 100, 1, 39.9, (), (), any_unit) is not None
    assert stock.take(MODE, 100, 1, 40.0, (), (), any_unit) is None
    assert stock.returned() == [UnusedSpace(vid=1, size=10 * MiB - 100, bids=99)]
    assert stock.held(40.0) == {MODE: (0, 0, 0.0)}


def test_too_big_or_too_many_blobs_find_no_grant() -> None:
    stock = standby()
    grant(stock, vid=1, bids=4, size=4 * MiB)
    assert stock.take(MODE, 4 * MiB + 1, 1, 0.0, (), (), any_unit) is None
    assert stock.take(MODE, 10, 5, 0.0, (), (), any_unit) is None
    assert stock.take(12, 10, 1, 0.0, (), (), any_unit) is None  # another code mode


def test_a_used_up_grant_is_dropped_with_its_unused_bytes() -> None:
    stock = standby()
    grant(stock, vid=1, bids=2, size=1000)
    assert stock.take(MODE, 100, 1, 0.0, (), (), any_unit) is not None
    assert stock.take(MODE, 100, 1, 0.0, (), (), any_unit) is not None
    assert stock.returned() == [UnusedSpace(vid=1, size=800)]
    assert stock.take(MODE, 1, 1, 0.0, (), (), any_unit) is None


@pytest.mark.parametrize("seed", range(20))
def test_no_bid_is_handed_out_twice_nor_after_its_grant_ends(seed: int) -> None:
    """Random grants, takes, refills and expiries: every bid taken is unique, inside a grant, before its end,
    and no grant gives more bytes than it held."""
    import random

    rng = random.Random(seed)
    stock = standby()
    granted: dict[int, tuple[int, int, float, int]] = {}  # vid -> (first bid, count, end, bytes)
    bids = itertools.count(1, 1000)
    vids = itertools.count(1)
    seen: set[int] = set()
    used: dict[int, int] = {}
    now = 0.0
    for _ in range(300):
        now += rng.uniform(0, 3)
        if rng.random() < 0.2:
            for want in stock.wanted([MODE], now):
                vid, first = next(vids), next(bids)
                usable = rng.uniform(1, 60)
                stock.add(MODE, BlobSlice(vid=vid, min_bid=first, count=want.bids, usable_for=usable), want.bytes,
                          [vid], now)
                granted[vid] = (first, want.bids, now + usable, want.bytes)
        blobs, size = rng.randint(1, 3), rng.randint(1, 4 * MiB)
        taken = stock.take(MODE, size, blobs, now, (), (), any_unit)
        if taken is None:
            continue
        first, count, end, limit = granted[taken.vid]
        assert now < end and taken.usable_for == pytest.approx(end - now)
        ids = set(range(taken.min_bid, taken.min_bid + taken.count))
        assert len(ids) == blobs and not ids & seen and min(ids) >= first and max(ids) < first + count
        seen |= ids
        used[taken.vid] = used.get(taken.vid, 0) + size
        assert used[taken.vid] <= limit


def test_grants_too_short_to_ride_out_are_not_fetched_again_and_again() -> None:
    """While clustermgr cannot renew the allocators' leases, each grant comes back shorter than `ride_out`:
    it is kept (it still serves), the others too, and no other is asked for during the backoff."""
    stock = standby()
    grant(stock, vid=1, usable_for=50.0)
    grant(stock, vid=2, usable_for=50.0)
    assert len(stock.wanted([MODE], 25.0)) == 2  # both have less than 30 s left
    grant(stock, vid=3, usable_for=20.0, at=25.0)  # the allocator's lease lapses in 20 s: too short
    assert stock.returned() == [] and stock.held(25.0)[MODE][0] == 300
    assert stock.wanted([MODE], 30.0) == []
    assert len(stock.wanted([MODE], 35.5)) == 2  # after the backoff, asked again


def test_what_changed_is_told_once_for_the_state_file_and_a_restored_grant_goes_on_from_its_next_bid() -> None:
    """Each grant added or taken from comes out of `changes` as it stands (a copy), each one let go by its first bid;
    a grant held again from the state file is not a change, and is taken from where it stood."""
    stock = standby()
    grant(stock, vid=1, first=1000, usable_for=50.0)
    grant(stock, vid=2, first=5000, usable_for=40.0)
    stock.take(MODE, 100, 2, 1.0, (), (), any_unit)  # from vid 2, nearest its end
    kept, dropped = stock.changes()
    assert sorted((mode, g.vid, g.next_bid, g.bids_left) for mode, g in kept) == [(MODE, 1, 1000, 100),
                                                                                 (MODE, 2, 5002, 98)]
    assert dropped == [] and stock.changes() == ([], [])
    kept[1][1].next_bid = 0  # a copy: the stock is not touched
    assert stock.take(MODE, 100, 1, 1.0, (), (), any_unit) == BlobSlice(vid=2, min_bid=5002, count=1,
                                                                        usable_for=39.0)
    assert stock.take(MODE, 100, 1, 40.0, (), (), any_unit).vid == 1  # type: ignore[union-attr]  # vid 2 ended
    kept, dropped = stock.changes()
    assert [(g.vid, g.next_bid) for _, g in kept] == [(1, 1001)] and dropped == [5000]

    after_restart = standby()
    after_restart.restore(MODE, kept[0][1])
    assert after_restart.changes() == ([], [])
    assert after_restart.take(MODE, 100, 1, 41.0, (), (), any_unit) == BlobSlice(vid=1, min_bid=1001, count=1,
                                                                                 usable_for=9.0)
