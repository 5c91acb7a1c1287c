"""Calls bound for one peer ride together while others are on their way: group commit, on the client side.

A call goes out alone while fewer than `in_flight` calls to its peer are on their way, so an idle or lightly
loaded peer sees no added wait. Otherwise it queues; each time a call to the peer ends, what is queued (up to
`max_items` calls and `max_bytes`) goes out as one batch. Under load the peer then pays its request cycle once
per batch instead of once per call: a blobnode's request cycle was ~0.35 of the ~0.5 ms of CPU a shard write
cost it (issue 29's profile). Each caller still gets its own result or error, and a caller cancelled while its
call waits in the queue takes it out of the next batch. A queued call given a timeout (`timeout(item)`) fails with
`TimeoutError` once it has waited that long, batch on its way or not; a call sent alone is bounded by `send_one`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Lane(Generic[Item, Result]):
    """One peer's calls: how many are on their way, and those waiting for a batch."""

    busy: int = 0
    queue: deque[tuple[Item, asyncio.Future[Result]]] = field(default_factory=deque)


def take_batch(sizes: Sequence[int], max_items: int, max_bytes: int) -> int:
    """How many of the queued calls (their sizes, oldest first) the next batch takes: at least one, then as
    many as fit both limits."""
    total, count = 0, 0
    for size in sizes[:max_items]:
        if count and total + size > max_bytes:
            break
        total += size
        count += 1
    return count


def _expire(answer: asyncio.Future[Result]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


class Coalescer(Generic[Item, Result]):
    """`call(peer, item)` through `send_one`, or together with others through `send_many`, which answers each
    item in order with its result or the error it alone met (an error it raises is every item's)."""

    def __init__(self, send_one: Callable[[str, Item], Awaitable[Result]],
                 send_many: Callable[[str, list[Item]], Awaitable[list[Result | BaseException]]], *,
                 size: Callable[[Item], int], in_flight: int, max_items: int, max_bytes: int,
                 timeout: Callable[[Item], float | None] = lambda _: None) -> None:
        if in_flight < 1 or max_items < 2:
            raise ValueError("coalescing needs in_flight >= 1 and max_items >= 2")
        self._send_one, self._send_many, self._size, self._timeout = send_one, send_many, size, timeout
        self._in_flight, self._max_items, self._max_bytes = in_flight, max_items, max_bytes
        self._lanes: dict[str, _Lane[Item, Result]] = {}
        self._sending: set[asyncio.Task[None]] = set()  # batches on their way (a task must be referenced)

    async def call(self, peer: str, item: Item) -> Result:
        lane = self._lanes.get(peer)
        if lane is None:
            lane = self._lanes[peer] = _Lane()
        if lane.busy < self._in_flight and not lane.queue:
            lane.busy += 1
            try:
                return await self._send_one(peer, item)
            finally:
                lane.busy -= 1
                self._next(peer, lane)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Result] = loop.create_future()
        lane.queue.append((item, answer))
        limit = self._timeout(item)
        if limit is None:
            return await answer
        timer = loop.call_later(limit, _expire, answer)  # a timer: asyncio.timeout costs several times more
        try:
            return await answer
        finally:
            timer.cancel()

    def _next(self, peer: str, lane: _Lane[Item, Result]) -> None:
        while lane.busy < self._in_flight and lane.queue:
            while lane.queue and lane.queue[0][1].done():  # its caller was cancelled while it waited
                lane.queue.popleft()
            sizes = [self._size(item) for item, _ in islice(lane.queue, self._max_items)]
            if not sizes:
                return
            taken = [lane.queue.popleft() for _ in range(take_batch(sizes, self._max_items, self._max_bytes))]
            batch = [(item, answer) for item, answer in taken if not answer.done()]
            if not batch:
                continue
            lane.busy += 1
            task = asyncio.get_running_loop().create_task(self._send(peer, lane, batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, peer: str, lane: _Lane[Item, Result],
                    batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            if len(batch) == 1:
                results: list[Result | BaseException] = [await self._send_one(peer, batch[0][0])]
            else:
                results = await self._send_many(peer, [item for item, _ in batch])
            for (_, answer), result in zip(batch, results, strict=True):
                if answer.done():
                    continue
                if isinstance(result, BaseException):
                    answer.set_exception(result)
                else:
                    answer.set_result(result)
        except Exception as exc:  # the whole batch failed (an unreachable peer, a refused request)
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
        except asyncio.CancelledError:
            for _, answer in batch:
                answer.cancel()
            raise
        finally:
            lane.busy -= 1
            self._next(peer, lane)
