"""Background I/O caps of one disk: at most `concurrency` background operations at a time, and `rate`
bytes per second on average (`libs.ratelimit`). User I/O never passes through here: it runs on the
disk's own threads, while background I/O runs on a separate, smaller pool, so it never waits behind a
background queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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
