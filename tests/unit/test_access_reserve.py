"""Small objects' bids and bytes from a reservation: when one serves, and what goes back to the allocator."""

from __future__ import annotations

from blobstore_server.libs.proto.allocator import BlobSlice, UnusedSpace
from blobstore_server.services.access.reserve import Reservations

MODE = 11


def held(ttl: float = 1.0) -> Reservations:
    reserved = Reservations(bids=3, bytes=1600, ttl=ttl)
    reserved.add(MODE, BlobSlice(vid=5, min_bid=100, count=3, usable_for=8.0), disks=[1, 2, 3], asked_at=10.0)
    return reserved


def test_small_single_blob_objects_only() -> None:
    reserved = Reservations(bids=64, bytes=1600, ttl=1.0)
    assert reserved.eligible(100, 1) and not reserved.eligible(101, 1) and not reserved.eligible(10, 2)
    assert not Reservations(bids=0, bytes=1600, ttl=1.0).eligible(10, 1)  # turned off


def test_bids_in_order_until_they_run_out() -> None:
    reserved = held()
    taken = [reserved.take(MODE, 100, 10.5, (), ()) for _ in range(4)]
    assert taken[:3] == [BlobSlice(vid=5, min_bid=b, count=1) for b in (100, 101, 102)]
    assert taken[3] is None
    assert reserved.returned() == [UnusedSpace(vid=5, size=1300)]
    assert reserved.returned() == []  # handed back once
    assert reserved.take(13, 100, 10.5, (), ()) is None  # another code mode has its own


def test_dropped_when_old_full_excluded_or_on_an_avoided_disk() -> None:
    assert held().take(MODE, 100, 11.0, (), ()) is None  # ttl over
    assert held().take(MODE, 1601, 10.0, (), ()) is None  # too few bytes left
    assert held().take(MODE, 100, 10.0, [5], ()) is None  # a blob missed its quorum in volume 5
    reserved = held()
    assert reserved.take(MODE, 100, 10.0, [6], [2]) is None  # disk 2 failed lately
    assert reserved.returned() == [UnusedSpace(vid=5, size=1600, bids=3)]
    assert reserved.take(MODE, 100, 10.0, [], []) is None  # dropped for good
    assert held().take(MODE, 100, 10.0, [6], [4]) == BlobSlice(vid=5, min_bid=100, count=1)


def test_a_new_reservation_returns_the_last_ones_rest() -> None:
    reserved = held()
    reserved.take(MODE, 100, 10.0, (), ())
    reserved.add(MODE, BlobSlice(vid=6, min_bid=200, count=3, usable_for=8.0), disks=[4], asked_at=10.2)
    assert reserved.returned() == [UnusedSpace(vid=5, size=1500, bids=2)]
    assert reserved.take(MODE, 100, 10.3, (), ()) == BlobSlice(vid=6, min_bid=200, count=1)


def test_used_no_longer_than_the_allocator_said_counted_from_the_ask() -> None:
    """The allocator's `usable_for` is a duration from when access sent the request: a reservation asked for at
    10.0 that the allocator says is usable for 0.4 s is done at 10.4, whenever the answer came, and before its ttl."""
    reserved = Reservations(bids=3, bytes=1600, ttl=1.0)
    reserved.add(MODE, BlobSlice(vid=5, min_bid=100, count=3, usable_for=0.4), disks=[1], asked_at=10.0)
    assert reserved.take(MODE, 100, 10.39, (), ()) == BlobSlice(vid=5, min_bid=100, count=1)
    assert reserved.take(MODE, 100, 10.4, (), ()) is None
