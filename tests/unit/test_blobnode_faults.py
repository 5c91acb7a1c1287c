"""When failed system calls make a disk broken: `threshold` of them within `window` seconds."""

from __future__ import annotations

import pytest

from blobstore_server.services.blobnode.faults import DiskFaults


def test_three_failures_within_the_window_make_a_disk_failing_and_only_that_disk() -> None:
    faults = DiskFaults(threshold=3, window=600)
    for at in (0.0, 1.0):
        faults.record(7, at)
    faults.record(8, 1.5)
    assert faults.failing(2.0) == []
    faults.record(7, 2.0)
    assert faults.failing(2.0) == [7]
    assert faults.failing(600.0) == [7]  # still within 600 s of the first
    assert faults.failing(601.0) == []  # it aged out; nothing new failed


def test_failures_spread_wider_than_the_window_never_condemn_a_disk() -> None:
    """A bad sector met every few hours for years: many failures in all, never three in ten minutes."""
    faults = DiskFaults(threshold=3, window=600)
    for hour in range(1000):
        faults.record(1, hour * 3600.0)
        assert faults.failing(hour * 3600.0) == []
    assert faults.totals[1] == 1000


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_the_threshold_counts_the_latest_failures(threshold: int) -> None:
    faults = DiskFaults(threshold=threshold, window=10)
    for i in range(threshold - 1):
        faults.record(1, 100.0 * i)
    assert faults.failing(100.0 * threshold) == []
    for i in range(threshold):
        faults.record(1, 1000.0 + i)
    assert faults.failing(1000.0 + threshold) == [1]
