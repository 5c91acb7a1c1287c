from __future__ import annotations

from services.tinker.rules import RetryPolicy, delete_due


def test_backoff_doubles_and_caps() -> None:
    policy = RetryPolicy(base=1, cap=10)
    assert [policy.backoff(r) for r in (1, 2, 3, 4, 5, 50)] == [1, 2, 4, 8, 10, 10]


def test_delete_waits_out_the_safe_delay() -> None:
    assert delete_due(100.0, 30.0, now=110.0) == 20.0
    assert delete_due(100.0, 30.0, now=130.0) == 0.0
