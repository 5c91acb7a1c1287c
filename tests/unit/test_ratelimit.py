"""Byte-rate caps (libs/ratelimit.py): the token bucket rule over any schedule of work."""

from __future__ import annotations

import random

import pytest

from blobstore_server.libs.ratelimit import TokenBucket


def test_a_full_bucket_lets_a_burst_through_then_paces_at_the_rate() -> None:
    bucket = TokenBucket(rate=100.0, burst=50.0, now=0.0)
    assert bucket.delay(0.0) == 0.0
    bucket.take(50, 0.0)
    assert bucket.delay(0.0) == 0.0  # spent exactly: nothing owed
    bucket.take(30, 0.0)
    assert bucket.delay(0.0) == pytest.approx(0.3)  # 30 bytes of debt at 100 B/s
    assert bucket.delay(0.1) == pytest.approx(0.2)
    assert bucket.delay(0.3) == 0.0
    assert bucket.delay(10.0) == 0.0 and bucket.tokens == 50.0  # refills up to the burst, no further


def test_a_clock_going_backwards_changes_nothing() -> None:
    bucket = TokenBucket(rate=10.0, burst=0.0, now=5.0)
    bucket.take(10, 5.0)
    assert bucket.delay(4.0) == pytest.approx(1.0)
    assert bucket.delay(6.0) == 0.0


def test_any_schedule_of_work_stays_within_rate_times_time_plus_burst_plus_one_operation() -> None:
    rng = random.Random(5)
    for _ in range(200):
        rate, burst = rng.uniform(10, 1000), rng.uniform(0, 500)
        bucket, now, done, largest = TokenBucket(rate, burst, 0.0), 0.0, 0, 0
        for _ in range(100):
            now += bucket.delay(now) + rng.choice([0.0, 0.0, rng.uniform(0, 0.5)])
            assert bucket.delay(now) == 0.0
            size = rng.randint(1, 400)
            bucket.take(size, now)
            done += size
            largest = max(largest, size)
            assert done <= rate * now + burst + largest + 1e-6


def test_a_new_rate_counts_from_the_moment_it_is_set_and_debts_stay_owed() -> None:
    bucket = TokenBucket(rate=100.0, burst=0.0, now=0.0)
    bucket.take(100, 0.0)  # 1 s of debt at 100 B/s
    bucket.set_rate(10.0, burst=0.0, now=0.5)  # half of it paid at the old rate
    assert bucket.delay(0.5) == pytest.approx(5.0)  # the other 50 bytes at 10 B/s
    bucket.set_rate(1000.0, burst=200.0, now=1.5)  # 10 more paid; 40 owed, now at 1000 B/s
    assert bucket.delay(1.5) == pytest.approx(0.04)
    assert bucket.delay(10.0) == 0.0 and bucket.tokens == 200.0
    bucket.set_rate(1000.0, burst=20.0, now=10.0)  # a smaller burst takes away what is over it
    assert bucket.tokens == 20.0
    with pytest.raises(ValueError):
        bucket.set_rate(0.0, 1.0, 11.0)


def test_any_schedule_of_rates_keeps_the_work_within_what_each_stretch_allowed() -> None:
    """Starting empty, the work done never exceeds the integral of the rate over time plus the last operation."""
    rng = random.Random(6)
    for _ in range(200):
        bucket, now, done, allowed, largest = TokenBucket(100.0, 0.0, 0.0), 0.0, 0, 0.0, 0
        for _ in range(100):
            if rng.random() < 0.2:
                bucket.set_rate(rng.uniform(10, 1000), rng.uniform(0, 300), now)
            wait = bucket.delay(now) + rng.choice([0.0, rng.uniform(0, 0.3)])
            allowed += wait * bucket.rate
            now += wait
            size = rng.randint(1, 400)
            bucket.take(size, now)
            done += size
            largest = max(largest, size)
            assert done <= allowed + largest + 1e-6


def test_invalid_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        TokenBucket(1.0, -1.0, 0.0)
