"""The blobnode's background I/O gate (services/blobnode/iolimit.py): slots and rate per disk."""

from __future__ import annotations

import asyncio

import pytest

from blobstore_server.services.blobnode.iolimit import BackgroundGate


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
