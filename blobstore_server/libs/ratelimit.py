"""Byte-rate caps: the pure pacing rule (`TokenBucket`, the caller passes the clock) and its async shell
(`Pacer`). Used by blobnodes for background I/O per disk and by workers for migration bandwidth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

RECHECK = 0.05  # seconds: the longest a waiter sleeps before it looks at the rate again


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

    def set_rate(self, rate: float, burst: float, now: float) -> None:
        """From `now` on, refill at `rate` up to `burst`; time before `now` counts at the old rate, and a debt
        stays owed."""
        if rate <= 0 or burst < 0:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 0, got {rate}, {burst}")
        self._refill(now)
        self.rate, self.burst = rate, burst
        self.tokens = min(self.tokens, burst)


class Pacer:
    """`await wait()` before a piece of work, `charge(bytes)` after it: the work runs at `rate` on average."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.bucket = TokenBucket(rate, burst, clock())
        self.bytes = 0

    async def wait(self) -> None:
        while (pause := self.bucket.delay(self.clock())) > 0:
            await asyncio.sleep(min(pause, RECHECK))  # a rate raised meanwhile counts soon

    def charge(self, amount: int) -> None:
        self.bytes += amount
        self.bucket.take(amount, self.clock())

    def set_rate(self, rate: float, burst: float) -> None:
        self.bucket.set_rate(rate, burst, self.clock())
