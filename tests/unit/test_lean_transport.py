"""The lean shard transport against real sockets: keep-alive reuse, a peer that closed an idle connection,
typed errors, timeouts, and answers it refuses to guess at."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from blobstore_server.libs.rpc.client import HttpClient
from blobstore_server.libs.rpc.errors import Internal, NotFound, Unavailable
from blobstore_server.libs.rpc.lean import LeanTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = next(int(line.split(":")[1]) for line in head.split("\r\n") if line.lower().startswith("content-length"))
    return head.split("\r\n")[0], await reader.readexactly(length)


def _answer(status: int, body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


async def _serve(handler: Handler, test: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await test(f"http://127.0.0.1:{port}")
    finally:
        server.close()


def test_keep_alive_reuse_and_a_closed_idle_connection() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        # answer two requests, then close the connection as an idle-timeout would
        for _ in range(2):
            line, body = await _read_request(reader)
            writer.write(_answer(200, line.encode() + b" " + body))
            await writer.drain()
        writer.close()

    async def test(url: str) -> None:
        async with HttpClient(LeanTransport()) as http:
            answers = [await http.request("PUT", f"{url}/shard/put", params={"bid": i}, data=b"x" * i)
                       for i in range(1, 6)]
        assert answers[0] == b"PUT /shard/put?bid=1 HTTP/1.1 x"
        assert answers[4] == b"PUT /shard/put?bid=5 HTTP/1.1 xxxxx"
        assert len(connections) == 3  # two requests per connection; each close noticed and retried once

    asyncio.run(_serve(handler, test))


def test_errors_timeouts_and_answers_it_refuses() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _ = await _read_request(reader)
        if "missing" in line:
            writer.write(_answer(404, b'{"code": "shard_not_found", "error": "bid 7 not in chunk"}'))
        elif "chunked" in line:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
        elif "slow" in line:
            await asyncio.sleep(5)
        elif "cut" in line:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
            writer.close()
            return
        await writer.drain()
        writer.close()  # one request per connection: the next one finds it closed and connects again

    async def test(url: str) -> None:
        async with HttpClient(LeanTransport()) as http:
            with pytest.raises(NotFound, match="bid 7"):
                await http.request("GET", f"{url}/missing")
            with pytest.raises(Internal, match="chunked"):
                await http.request("GET", f"{url}/chunked")
            with pytest.raises(Unavailable, match="no answer within"):
                await http.request("GET", f"{url}/slow", timeout=0.3)
            with pytest.raises(Unavailable):
                await http.request("GET", f"{url}/cut")

    asyncio.run(_serve(handler, test))


def test_nobody_listening_is_unavailable() -> None:
    async def test() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        async with HttpClient(LeanTransport()) as http:
            with pytest.raises(Unavailable, match="cannot connect"):
                await http.request("GET", f"http://127.0.0.1:{port}/shard/get")

    asyncio.run(test())


def test_every_idle_connection_the_peer_closed_is_skipped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _ = await _read_request(reader)
        writer.write(_answer(200, line.encode()))
        await writer.drain()
        writer.close()  # as uvicorn does once a keep-alive connection idled too long

    async def test(url: str) -> None:
        async with HttpClient(LeanTransport()) as http:
            await asyncio.gather(*(http.request("GET", f"{url}/shard/get", params={"bid": i}) for i in range(4)))
            await asyncio.sleep(0.2)  # four idle connections, all closed by the peer
            assert await http.request("GET", f"{url}/shard/get", params={"bid": 9}) == b"GET /shard/get?bid=9 HTTP/1.1"

    asyncio.run(_serve(handler, test))


def test_an_idle_connection_whose_handle_closed_unseen_is_replaced() -> None:
    """uvloop raises RuntimeError ("the handler is closed") when writing to a connection the peer reset before
    connection_lost ran (seen under network partitions). That race cannot be timed from a test, so the
    transport's write is made to fail that way (a named fake fault): the request goes over a fresh connection."""
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            try:
                _, body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(_answer(200, body))
            await writer.drain()

    async def test(url: str) -> None:
        transport = LeanTransport()
        async with HttpClient(transport) as http:
            assert await http.request("PUT", f"{url}/shard/put", data=b"one") == b"one"
            (idle,) = [conn for conns in transport._idle.values() for conn in conns]
            assert idle.transport is not None

            def closed_handle(_: object) -> None:
                raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

            idle.transport.writelines = closed_handle  # type: ignore[method-assign]
            assert await http.request("PUT", f"{url}/shard/put", data=b"two") == b"two"
        assert len(connections) == 2

    asyncio.run(_serve(handler, test))
