from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.tinker.rules import OffsetTracker, RetryPolicy, delete_due


@settings(max_examples=500, deadline=None)
@given(count=st.integers(1, 30), data=st.data())
def test_committable_offset_never_passes_unfinished_work(count: int, data: st.DataObject) -> None:
    first = data.draw(st.integers(0, 1000))
    tracker = OffsetTracker()
    offsets = list(range(first, first + count))
    for offset in offsets:
        tracker.take(offset)
    order = data.draw(st.permutations(offsets))
    finished: set[int] = set()
    for offset in order[: data.draw(st.integers(0, count))]:
        tracker.finish(offset)
        finished.add(offset)
        commit = tracker.committable()
        assert commit is not None
        # Everything below the commit point is finished; the commit point itself is not.
        assert all(o in finished for o in range(first, commit))
        assert commit == first + count or commit not in finished
    assert tracker.in_flight == count - len(finished)


def test_tracker_ignores_replays_below_the_commit_point() -> None:
    tracker = OffsetTracker()
    for offset in (5, 6):
        tracker.take(offset)
        tracker.finish(offset)
    assert tracker.committable() == 7
    tracker.take(5)  # replayed after a rebalance: already done
    assert tracker.committable() == 7 and tracker.in_flight == 0
    assert OffsetTracker().committable() is None


def test_backoff_doubles_and_caps() -> None:
    policy = RetryPolicy(base=1, cap=10)
    assert [policy.backoff(r) for r in (1, 2, 3, 4, 5, 50)] == [1, 2, 4, 8, 10, 10]


def test_delete_waits_out_the_safe_delay() -> None:
    assert delete_due(100.0, 30.0, now=110.0) == 20.0
    assert delete_due(100.0, 30.0, now=130.0) == 0.0
