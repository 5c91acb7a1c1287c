"""The tail estimate that decides when a small read asks other shards too (services/access/tail.py)."""

from __future__ import annotations

import pytest

from blobstore_server.services.access.tail import TailDelay


def test_no_delay_until_a_quarter_of_the_window_was_seen() -> None:
    tail = TailDelay(0.95, floor=0.0, window=64)
    for _ in range(15):
        tail.observe(0.010)
    assert tail.delay() is None
    tail.observe(0.010)
    assert tail.delay() == 0.010


def test_the_quantile_of_the_window_and_never_below_the_floor() -> None:
    tail = TailDelay(0.95, floor=0.002, window=80)  # recomputed every 10
    for k in range(80):
        tail.observe((k + 1) / 1000 + 0.1)  # 101 .. 180 ms
    assert tail.delay() == pytest.approx(0.176)  # the 76th of 80
    fast = TailDelay(0.95, floor=0.002, window=80)
    for _ in range(80):
        fast.observe(0.0005)
    assert fast.delay() == 0.002


def test_a_tail_made_of_stalls_is_capped_at_a_multiple_of_the_median() -> None:
    tail = TailDelay(0.95, floor=0.001, window=80)
    for k in range(80):
        tail.observe(0.030 if k % 8 == 0 else 0.002)  # one read in 8 held up 30 ms by a stalled node
    assert tail.delay() == pytest.approx(0.006)  # 3 x the median, not the 95th percentile's 30 ms


def test_old_latencies_leave_the_window_and_the_estimate_follows() -> None:
    tail = TailDelay(0.9, floor=0.0, window=80, median_multiple=100)
    for _ in range(80):
        tail.observe(0.050)
    assert tail.delay() == 0.050
    for _ in range(70):
        tail.observe(0.001)
    assert tail.delay() == 0.050  # 10 slow reads of 80 are still the slowest 10%
    for _ in range(10):
        tail.observe(0.001)
    assert tail.delay() == 0.001


@pytest.mark.parametrize(("quantile", "window"), [(0.0, 64), (1.0, 64), (0.9, 4)])
def test_nonsense_is_refused(quantile: float, window: int) -> None:
    with pytest.raises(ValueError):
        TailDelay(quantile, floor=0.0, window=window)
