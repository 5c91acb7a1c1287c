"""The blobnode's background I/O caps (services/blobnode/iolimit.py): pacing rule and its async gate."""

from __future__ import annotations

import asyncio
import random

import pytest

from services.blobnode.iolimit import BackgroundGate, TokenBucket


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


def test_invalid_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        TokenBucket(1.0, -1.0, 0.0)


def test_the_gate_caps_concurrency_and_rate_and_counts_what_waits() -> None:
    async def scenario() -> None:
        gate = BackgroundGate(rate=1_000_000, concurrency=2, burst=0)
        peak = 0
        seen_queued = 0
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def op() -> None:
            nonlocal peak, seen_queued
            async with gate.slot():
                peak = max(peak, gate.running)
                seen_queued = max(seen_queued, gate.queued)
                await asyncio.sleep(0.01)
                gate.charge(50_000)

        await asyncio.gather(*(op() for _ in range(10)))
        elapsed = loop.time() - start
        assert peak == 2 and seen_queued >= 1
        assert gate.queued == gate.running == 0 and gate.bytes == 500_000
        # 500 kB at 1 MB/s, the last operation's bytes charged after it ran: at least ~0.4 s.
        assert elapsed >= 0.4

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_its_slot_back() -> None:
    async def scenario() -> None:
        gate = BackgroundGate(rate=1000, concurrency=1, burst=0)
        gate.charge(10_000)  # 10 s of debt: the next slot waits
        waiter = asyncio.create_task(_enter(gate))
        await asyncio.sleep(0.05)
        assert gate.queued == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.queued == 0 and not gate.slots.locked()

    asyncio.run(scenario())


async def _enter(gate: BackgroundGate) -> None:
    async with gate.slot():
        pass
