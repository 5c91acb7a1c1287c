"""The commit position never passes an unfinished message, whatever order work finishes in."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from blobstore_server.libs.mq.offsets import OffsetTracker
from blobstore_server.libs.proto.messages import DeleteMsg, RepairMsg

TP = ("shard_repair", 0)


def test_position_stops_at_the_lowest_unfinished_offset() -> None:
    tracker = OffsetTracker()
    for offset in range(10):
        tracker.add(TP, offset)
    for offset in (0, 1, 2, 4, 5):
        tracker.done(TP, offset)
    assert tracker.committable() == {TP: 3}
    tracker.mark_committed({TP: 3})
    assert tracker.committable() == {}
    for offset in (3, 6, 7, 8, 9):
        tracker.done(TP, offset)
    assert tracker.committable() == {TP: 10}
    assert tracker.pending() == 0


def test_partitions_are_independent() -> None:
    tracker = OffsetTracker()
    other = ("shard_repair", 1)
    tracker.add(TP, 5)
    tracker.add(other, 7)
    tracker.done(other, 7)
    assert tracker.committable() == {TP: 5, other: 8}


def test_redelivered_message_holds_the_position_back_again() -> None:
    tracker = OffsetTracker()
    tracker.add(TP, 0)
    tracker.done(TP, 0)
    tracker.mark_committed(tracker.committable())
    tracker.add(TP, 0)  # seen again after a rebalance
    assert tracker.committable() == {TP: 0}


@pytest.mark.parametrize("seed", range(20))
def test_random_completion_order_never_commits_unfinished_work(seed: int) -> None:
    rng = random.Random(seed)
    tracker = OffsetTracker()
    offsets = list(range(50))
    for offset in offsets:
        tracker.add(TP, offset)
    rng.shuffle(offsets)
    finished: set[int] = set()
    for offset in offsets:
        tracker.done(TP, offset)
        finished.add(offset)
        position = tracker.committable().get(TP, 0)
        assert set(range(position)) <= finished
        assert position == len(finished) or position not in finished


def test_messages_round_trip_as_json_and_reject_bad_fields() -> None:
    repair = RepairMsg(vid=7, bid=2**40, bad_indexes=[1, 4], reason="put: unit 1 timeout")
    assert RepairMsg.model_validate_json(repair.to_bytes()) == repair
    assert repair.key() == f"7/{2**40}".encode()
    delete = DeleteMsg(vid=7, bid=1, time=1.5e9, retry=2, not_before=1.6e9)
    assert DeleteMsg.model_validate_json(delete.to_bytes()) == delete
    for bad in ({"vid": 1, "bid": 1, "bad_indexes": []}, {"vid": -1, "bid": 1, "bad_indexes": [0]},
                {"vid": 1, "bid": 1, "bad_indexes": [0], "extra": 1}):
        with pytest.raises(ValidationError):
            RepairMsg.model_validate(bad)
