"""The SDK's reading of a read plan's pieces, against real sockets on 127.0.0.1: a blobnode that stalls is given
up on within the plan's piece timeout and then skipped without another try, while the others are still read."""

from __future__ import annotations

import asyncio
import time

import pytest

from blobstore import AsyncClient
from blobstore.client import _DirectReadFailed
from blobstore.records import ReadPlan, ShardPiece


async def _server(answer: bytes | None, accepted: list[int]) -> tuple[asyncio.Server, str]:
    """An HTTP server on a free port answering every request with `answer`, or never (None)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        while await reader.readuntil(b"\r\n\r\n"):
            if answer is None:
                await asyncio.sleep(60)
            else:
                writer.write(answer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read(client: AsyncClient, *urls: str) -> bytes:
    plan = ReadPlan(size=5 * len(urls), pieces=[ShardPiece(url=f"{url}/shard/get?bid=1", size=5) for url in urls],
                    piece_timeout=0.2)
    return b"".join([piece async for piece in client._read_direct(plan)])


def test_a_stalled_blobnode_is_given_up_on_then_skipped_and_the_others_still_read() -> None:
    async def run() -> None:
        stalled: list[int] = []
        answering: list[int] = []
        silent, silent_url = await _server(None, stalled)
        live, live_url = await _server(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", answering)
        async with AsyncClient("http://127.0.0.1:1") as client:
            assert await _read(client, live_url, live_url) == b"hellohello"
            started = time.monotonic()
            with pytest.raises(_DirectReadFailed):
                await _read(client, live_url, silent_url)
            assert 0.2 <= time.monotonic() - started < 2
            started = time.monotonic()
            with pytest.raises(_DirectReadFailed, match="did not answer lately"):
                await _read(client, silent_url)
            assert time.monotonic() - started < 0.1 and len(stalled) == 1  # not tried again
            assert await _read(client, live_url) == b"hello"
        for server in (silent, live):
            server.close()

    asyncio.run(run())
