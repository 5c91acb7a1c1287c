"""libs/rpc/coalesce.py: which calls go alone, which ride together, and who gets which answer."""

from __future__ import annotations

import asyncio

import pytest

from blobstore_server.libs.rpc.coalesce import Coalescer, take_batch
from blobstore_server.libs.rpc.errors import Unreachable


@pytest.mark.parametrize(("sizes", "max_items", "max_bytes", "taken"), [
    ([10], 4, 100, 1),
    ([10, 10, 10, 10, 10], 4, 100, 4),  # the item limit
    ([40, 40, 40], 8, 100, 2),  # the byte limit
    ([500, 1], 8, 100, 1),  # one over the byte limit still goes, alone
    ([1, 500], 8, 100, 1),
    ([50, 50], 8, 100, 2),  # exactly at the limit
])
def test_a_batch_takes_the_oldest_calls_that_fit(sizes: list[int], max_items: int, max_bytes: int,
                                                 taken: int) -> None:
    assert take_batch(sizes, max_items, max_bytes) == taken


class Peer:
    """Answers as a peer would, and records each request: ("one", item) or ("many", items). A request is held
    until `release` so a test decides what is in flight."""

    def __init__(self, failing: frozenset[int] = frozenset(), down: bool = False) -> None:
        self.requests: list[tuple[str, object]] = []
        self.failing, self.down = failing, down
        self.gate = asyncio.Event()

    async def one(self, peer: str, item: int) -> str:
        self.requests.append(("one", item))
        await self.gate.wait()
        if self.down:
            raise Unreachable("peer down")
        return f"{peer}:{item}"

    async def many(self, peer: str, items: list[int]) -> list[str | BaseException]:
        self.requests.append(("many", list(items)))
        await self.gate.wait()
        if self.down:
            raise Unreachable("peer down")
        return [ValueError(f"bad {i}") if i in self.failing else f"{peer}:{i}" for i in items]


def coalescer(peer: Peer, in_flight: int = 1, max_items: int = 64) -> Coalescer[int, str]:
    return Coalescer(peer.one, peer.many, size=lambda item: 1, in_flight=in_flight, max_items=max_items,
                     max_bytes=1 << 20)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_calls_beyond_the_limit_ride_together_each_with_its_own_answer() -> None:
    async def scenario() -> None:
        peer = Peer(failing=frozenset({3}))
        c = coalescer(peer)
        calls = [asyncio.create_task(c.call("a", i)) for i in range(1, 6)]
        other = asyncio.create_task(c.call("b", 9))  # another peer has its own lane
        await settle()
        assert peer.requests == [("one", 1), ("one", 9)]  # the rest wait for the call in flight
        peer.gate.set()
        results = await asyncio.gather(*calls, other, return_exceptions=True)
        assert peer.requests == [("one", 1), ("one", 9), ("many", [2, 3, 4, 5])]
        assert results[:2] == ["a:1", "a:2"] and results[3:] == ["a:4", "a:5", "b:9"]
        assert isinstance(results[2], ValueError)

    asyncio.run(scenario())


def test_an_idle_peer_gets_each_call_alone_up_to_the_limit() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.gate.set()
        c = coalescer(peer, in_flight=2)
        assert [await c.call("a", i) for i in range(3)] == ["a:0", "a:1", "a:2"]
        assert await asyncio.gather(*(c.call("a", i) for i in range(3, 6))) == ["a:3", "a:4", "a:5"]
        # two at once went alone; the third waited and went alone too (a batch of one is a plain call)
        assert peer.requests == [("one", i) for i in range(6)]

    asyncio.run(scenario())


def test_a_failed_batch_fails_each_of_its_callers_and_the_next_batch_still_goes() -> None:
    async def scenario() -> None:
        peer = Peer(down=True)
        c = coalescer(peer, max_items=2)
        calls = [asyncio.create_task(c.call("a", i)) for i in range(5)]
        await settle()
        peer.gate.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, Unreachable) for r in results), results
        assert peer.requests == [("one", 0), ("many", [1, 2]), ("many", [3, 4])]

    asyncio.run(scenario())


def test_a_caller_cancelled_while_queued_leaves_the_batch() -> None:
    async def scenario() -> None:
        peer = Peer()
        c = coalescer(peer)
        calls = [asyncio.create_task(c.call("a", i)) for i in range(4)]
        await settle()
        calls[2].cancel()
        await settle()
        peer.gate.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert peer.requests == [("one", 0), ("many", [1, 3])]
        assert results[0] == "a:0" and results[1] == "a:1" and results[3] == "a:3"
        assert isinstance(results[2], asyncio.CancelledError)

    asyncio.run(scenario())


def test_a_queued_call_times_out_on_its_own_and_leaves_the_batch() -> None:
    async def scenario() -> None:
        peer = Peer()
        calls = Coalescer(peer.one, peer.many, size=lambda item: 1, in_flight=1, max_items=64, max_bytes=1 << 20,
                          timeout=lambda item: 0.05 if item == 2 else None)
        first = asyncio.create_task(calls.call("p", 1))
        await settle()
        late, patient = asyncio.create_task(calls.call("p", 2)), asyncio.create_task(calls.call("p", 3))
        with pytest.raises(TimeoutError):
            await late  # still queued behind the first after its 0.05 s
        peer.gate.set()
        assert await first == "p:1" and await patient == "p:3"
        assert peer.requests == [("one", 1), ("one", 3)]  # the expired call was not sent

    asyncio.run(scenario())
