"""Background I/O caps of one disk: at most `concurrency` background operations at a time, and `rate`
bytes per second on average. User I/O never passes through here: it runs on the disk's own threads,
while background I/O runs on a separate, smaller pool, so it never waits behind a background queue.

`TokenBucket` is the pure pacing rule (the caller passes the clock); `BackgroundGate` is its async shell.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class TokenBucket:
    """Bytes per second with a burst. Work is charged after it is done, so the bucket may go into debt;
    nothing new starts until the debt is paid off. Over any long stretch the bytes stay within
    `rate * seconds + burst + the last operations' sizes`."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst < 0:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 0, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def delay(self, now: float) -> float:
        """Seconds to wait before starting more work (0: start now)."""
        self._refill(now)
        return 0.0 if self.tokens > -1e-6 else -self.tokens / self.rate  # a millionth of a byte: float noise

    def take(self, amount: int, now: float) -> None:
        """Charge `amount` bytes of work done."""
        self._refill(now)
        self.tokens -= amount


class BackgroundGate:
    """One disk's background lane: a slot (of `concurrency`) per operation, opened once the bucket is out
    of debt. Counters for the metrics: operations waiting, running, and bytes charged."""

    def __init__(self, rate: float, concurrency: int, burst: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.bucket = TokenBucket(rate, burst, clock())
        self.slots = asyncio.Semaphore(concurrency)
        self.queued = 0
        self.running = 0
        self.bytes = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self.queued += 1
        try:
            await self.slots.acquire()
            try:
                while (wait := self.bucket.delay(self.clock())) > 0:
                    await asyncio.sleep(wait)
            except BaseException:
                self.slots.release()
                raise
        finally:
            self.queued -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self.slots.release()

    def charge(self, amount: int) -> None:
        self.bytes += amount
        self.bucket.take(amount, self.clock())
