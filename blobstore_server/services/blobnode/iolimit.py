"""Background I/O caps of one disk: at most `concurrency` background operations at a time, and `rate`
bytes per second on average (`libs.ratelimit`). User I/O never passes through here: it runs on the
disk's own threads, while background I/O runs on a separate, smaller pool, so it never waits behind a
background queue.

The rate itself follows the node's users (`PaceRule`, `AdaptiveRate`), the way LEDBAT's scavenger traffic
yields to foreground traffic: background I/O runs at its ceiling while no user request arrives, and while
users are served it grows a step at a time and halves whenever the node's event loop falls behind (its lag
is how CPU starvation shows in a user's latency), never below a floor, so repair always moves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from blobstore_server.libs.ratelimit import Pacer


class BackgroundGate:
    """One disk's background lane: a slot (of `concurrency`) per operation, opened once the rate allows.
    Counters for the metrics: operations waiting, running, and bytes charged."""

    def __init__(self, rate: float, concurrency: int, burst: float) -> None:
        self.pacer = Pacer(rate, burst)
        self.slots = asyncio.Semaphore(concurrency)
        self.queued = 0
        self.running = 0

    @property
    def bytes(self) -> int:
        return self.pacer.bytes

    @property
    def rate(self) -> float:
        return self.pacer.bucket.rate

    @property
    def busy(self) -> bool:
        return bool(self.queued or self.running)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self.queued += 1
        try:
            await self.slots.acquire()
            try:
                await self.pacer.wait()
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
        self.pacer.charge(amount)

    def set_rate(self, rate: float) -> None:
        self.pacer.set_rate(rate, burst=rate * BURST_SECONDS)


BURST_SECONDS = 0.25  # a gate may run this many seconds' worth of its rate at once


@dataclass(frozen=True)
class PaceRule:
    """Bytes per second per disk for background I/O, from what the node saw over the last window."""

    floor: float
    ceiling: float
    lag_limit: float  # seconds of event-loop lag (90th percentile of a window) that users should not see; 0: off
    steps: int = 32  # windows of additive growth from nothing to the ceiling

    @property
    def adaptive(self) -> bool:
        return self.lag_limit > 0 and self.floor < self.ceiling

    @property
    def start(self) -> float:
        return self.floor if self.adaptive else self.ceiling

    def next_rate(self, rate: float, users: int, lag: float) -> float:
        """`users`: user requests in the window; `lag`: the event loop's lag over it."""
        if users == 0:  # nobody to yield to
            return min(self.ceiling, rate * 2)
        if lag > self.lag_limit:
            return max(self.floor, rate / 2)
        return min(self.ceiling, rate + self.ceiling / self.steps)


class AdaptiveRate:
    """Sets every gate's rate by `rule` each `window` seconds while any gate has work, from the event loop's lag
    (how late a `tick`-second sleep wakes up) and the user requests counted by `user_request`. Nothing runs while
    background I/O is idle; after `restart_after` seconds idle the rate starts again from the floor."""

    def __init__(self, gates: Sequence[BackgroundGate], rule: PaceRule, window: float = 0.25, tick: float = 0.005,
                 restart_after: float = 2.0) -> None:
        self.gates, self.rule = gates, rule
        self.window, self.tick, self.restart_after = window, tick, restart_after
        self.rate = rule.start
        self.users = 0
        self.idle_since = float("-inf")
        self._follower: asyncio.Task[None] | None = None
        self._set(self.rate)

    @property
    def following(self) -> bool:
        return self._follower is not None

    def user_request(self) -> None:
        self.users += 1

    def wake(self) -> None:
        """Called as background work arrives: follow the load until the gates are idle again."""
        if self._follower is None and self.rule.adaptive:
            loop = asyncio.get_running_loop()
            if loop.time() - self.idle_since > self.restart_after:
                self._set(self.rule.floor)
            self._follower = loop.create_task(self._follow())

    def _set(self, rate: float) -> None:
        self.rate = rate
        for gate in self.gates:
            gate.set_rate(rate)

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self.users = 0
                lags: list[float] = []
                end = time.monotonic() + self.window
                while (before := time.monotonic()) < end:  # not loop.time(): uvloop's counts whole milliseconds
                    await asyncio.sleep(self.tick)
                    lags.append(time.monotonic() - before - self.tick)
                if not any(gate.busy for gate in self.gates):
                    return
                lags.sort()
                self._set(self.rule.next_rate(self.rate, self.users, lags[int(0.9 * (len(lags) - 1))]))
        finally:
            self._follower = None
            self.idle_since = loop.time()
