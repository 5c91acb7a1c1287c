"""Where a client sends background reads (`BackgroundReaders` of services/blobnode/client.py), driven by a
stand-in for the blobnodes' /stat (the real one: tests/integration/test_background_reader.py)."""

from __future__ import annotations

import asyncio

from blobstore_server.libs.proto.blobnode import NodeStat
from blobstore_server.libs.rpc.errors import Unreachable
from blobstore_server.services.blobnode.client import BackgroundReaders


class Stats:
    """Each node's /stat answer (its reader's URL), or Unreachable; counts the questions."""

    def __init__(self) -> None:
        self.readers: dict[str, str | None] = {}
        self.asked = 0

    async def __call__(self, host: str) -> NodeStat:
        self.asked += 1
        await asyncio.sleep(0.01)  # the question's round trip
        reader = self.readers[host]
        if reader is None:
            raise Unreachable(f"{host} does not answer")
        return NodeStat(host=host, cluster_id=1, idc="z0", rack="r0", disks=[], background_host=reader)


def test_a_node_is_asked_once_while_its_reader_answers_and_again_after_recheck_while_it_has_none() -> None:
    stats = Stats()
    readers = BackgroundReaders(stats, recheck=0.05)

    async def scenario() -> None:
        stats.readers = {"n1": "", "n2": "http://n2:2", "n3": None}
        assert await readers.of("n1") == ""
        assert await readers.of("n1") == ""  # within recheck: not asked again
        assert stats.asked == 1
        assert await readers.of("n3") == ""  # an unreachable node: the node itself, which then fails on its own
        stats.readers["n1"] = "http://n1:1"  # its reader came up
        await asyncio.sleep(0.06)
        assert await readers.of("n1") == "http://n1:1"
        asked = stats.asked
        for _ in range(5):
            assert await readers.of("n1") == "http://n1:1"
            assert await readers.of("n2") == "http://n2:2"
        assert stats.asked == asked + 1  # n2 once; n1 not again while its reader is known
        readers.forget("n1")  # its reader failed to answer
        assert await readers.of("n1") == ""
        await asyncio.sleep(0.06)
        assert await readers.of("n1") == "http://n1:1"

    asyncio.run(scenario())


def test_reads_in_flight_while_a_node_is_asked_go_to_the_node() -> None:
    stats = Stats()
    stats.readers = {"n1": "http://n1:1"}
    readers = BackgroundReaders(stats)

    async def scenario() -> None:
        first = asyncio.create_task(readers.of("n1"))
        await asyncio.sleep(0.001)  # the question is on its way
        assert await readers.of("n1") == ""
        assert await first == "http://n1:1"
        assert stats.asked == 1

    asyncio.run(scenario())
