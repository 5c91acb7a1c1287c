"""The blobnode's background I/O gate (services/blobnode/iolimit.py): slots and rate per disk."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from blobstore_server.services.blobnode.iolimit import AdaptiveRate, BackgroundGate, PaceRule

RULE = PaceRule(floor=8.0, ceiling=512.0, lag_limit=0.002)


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


def test_a_waiter_cancelled_before_its_turn_leaves_the_slots_as_they_were() -> None:
    async def scenario() -> None:
        gate = BackgroundGate(rate=1e12, concurrency=1, burst=1e12)
        release = asyncio.Event()

        async def holder() -> None:
            async with gate.slot():
                await release.wait()

        held = asyncio.create_task(holder())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(_enter(gate))
        await asyncio.sleep(0.01)
        assert gate.queued == 1 and gate.slots.locked()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await held
        assert gate.queued == 0 and not gate.slots.locked()
        await _enter(gate)  # the slot is free again

    asyncio.run(scenario())


async def _enter(gate: BackgroundGate) -> None:
    async with gate.slot():
        pass


def test_with_no_user_the_rate_doubles_up_to_the_ceiling_whatever_the_lag() -> None:
    rates = [RULE.floor]
    while rates[-1] < RULE.ceiling:
        rates.append(RULE.next_rate(rates[-1], users=0, lag=1.0))
    assert rates == [8, 16, 32, 64, 128, 256, 512]
    assert RULE.next_rate(512, users=0, lag=1.0) == 512


def test_with_users_a_lagging_loop_halves_the_rate_down_to_the_floor() -> None:
    assert RULE.next_rate(512, users=3, lag=0.0021) == 256
    assert RULE.next_rate(10, users=1, lag=0.05) == RULE.floor


def test_with_users_and_a_loop_that_keeps_up_the_rate_grows_a_step_at_a_time() -> None:
    assert RULE.next_rate(8, users=5, lag=0.002) == 8 + 512 / 32
    assert RULE.next_rate(510, users=5, lag=0.0) == 512


def test_any_sequence_of_windows_keeps_the_rate_between_floor_and_ceiling() -> None:
    rng = random.Random(3)
    rate = RULE.start
    for _ in range(10_000):
        rate = RULE.next_rate(rate, users=rng.choice([0, 0, 1, 7]), lag=rng.choice([0.0, 0.001, 0.002, 0.003, 0.5]))
        assert RULE.floor <= rate <= RULE.ceiling


def test_a_rule_without_a_lag_limit_or_room_is_a_fixed_rate_at_the_ceiling() -> None:
    assert PaceRule(floor=8.0, ceiling=64.0, lag_limit=0).start == 64.0
    assert not PaceRule(floor=64.0, ceiling=64.0, lag_limit=0.002).adaptive


def test_the_rate_follows_the_load_while_background_work_waits_and_rests_when_it_is_done() -> None:
    """Real event loop, real lag: a user request counted each window and the loop blocked 20 ms per tick
    halve the rate to the floor; no users lift it to the ceiling; idle, nothing runs."""
    async def scenario() -> None:
        gates = [BackgroundGate(rate=1.0, concurrency=1, burst=0), BackgroundGate(rate=1.0, concurrency=1, burst=0)]
        pace = AdaptiveRate(gates, PaceRule(floor=1000.0, ceiling=64_000.0, lag_limit=0.005), window=0.05)
        assert pace.rate == 1000.0 and all(g.rate == 1000.0 for g in gates)
        gates[0].charge(10**9)  # a debt: background work stays queued behind the gate
        waiter = asyncio.create_task(_enter(gates[0]))
        await asyncio.sleep(0)
        pace.wake()
        await asyncio.sleep(0.5)  # ten windows without users
        assert pace.rate == 64_000.0 and all(g.rate == 64_000.0 for g in gates)

        async def busy_users() -> None:
            while True:
                pace.user_request()
                await asyncio.sleep(0.004)
                time.sleep(0.02)  # the loop falls behind: CPU work on it

        users = asyncio.create_task(busy_users())
        await asyncio.sleep(0.6)
        assert pace.rate == 1000.0
        users.cancel()
        waiter.cancel()
        await asyncio.sleep(0.15)
        assert not pace.following  # idle: no probe runs

    asyncio.run(scenario())
