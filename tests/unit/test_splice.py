"""Deferred answers of the lean transport moved to another socket with splice(2), against real sockets: the bytes
arrive whole and in order, the connection serves the next request once its body is taken, and a body abandoned,
cut short by its peer or stalled closes its connection instead of leaving it half read. And the rule for when a
route is offered the splice extension at all."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable

import pytest

from blobstore_server.libs.rpc.asgi import SPLICE, Message, Receive, Scope, Send
from blobstore_server.libs.rpc.client import HttpClient
from blobstore_server.libs.rpc.errors import Internal
from blobstore_server.libs.rpc.lean import LeanTransport
from blobstore_server.libs.rpc.relay import splicing
from blobstore_server.libs.rpc.splice import AVAILABLE, SocketBody, SourceEnded, SpliceTimeout

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="splice(2) is Linux only")

LINE = b'{"shards": 2}\n'
DATA = os.urandom(3 << 20)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> str:
    return (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")[0]


def _head(length: int) -> bytes:
    return f"HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n\r\n".encode()


async def _serve(handler: Handler, test: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        await test(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()


async def _sink() -> tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter]:
    """A connected pair: the non-blocking socket to move bytes into, and a reader of what arrives."""
    arrived: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    server = await asyncio.start_server(lambda r, w: arrived.put_nowait((r, w)), "127.0.0.1", 0)
    destination = socket.create_connection(server.sockets[0].getsockname())
    destination.setblocking(False)
    reader, writer = await arrived.get()
    server.close()
    return destination, reader, writer


async def _moved(body: SocketBody, cuts: list[tuple[int, int]]) -> bytes:
    destination, reader, writer = await _sink()
    try:
        total = sum(size for _, size in cuts)
        receiving = asyncio.create_task(reader.readexactly(total))
        for start, size in cuts:
            await body.move(body.span(start, size), destination.fileno())
        return await receiving
    finally:
        destination.close()
        writer.close()


def test_a_deferred_body_moves_whole_in_spans_and_its_connection_serves_the_next_request() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            try:
                line = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            body = LINE + DATA if "big" in line else b"small\nanswer"
            writer.write(_head(len(body)) + body)
            await writer.drain()

    async def test(url: str) -> None:
        async with HttpClient(LeanTransport()) as http:
            for _ in range(2):
                line, body = await http.request_deferred("GET", f"{url}/big")
                assert bytes(line) == LINE and body is not None and body.length == len(DATA)
                cuts = [(0, 1000), (1000, (1 << 20) - 1000), (1 << 20, len(DATA) - (1 << 20))]
                assert await _moved(body, cuts) == DATA
                body.finish()
            whole, rest = await http.request_deferred("GET", f"{url}/small")
            assert bytes(whole) == b"small\nanswer" and rest is None  # all of it came at once: nothing deferred
        assert len(connections) == 1  # each body taken whole: the one connection served every request

    asyncio.run(_serve(handler, test))


def test_out_of_order_spans_are_refused_and_an_abandoned_body_closes_its_connection() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(_head(len(LINE) + len(DATA)) + LINE + DATA)
            await writer.drain()

    async def test(url: str) -> None:
        async with HttpClient(LeanTransport()) as http:
            _, body = await http.request_deferred("GET", f"{url}/big")
            assert body is not None
            with pytest.raises(Internal, match="out of order"):
                await _moved(body, [(1 << 20, 10)])
            body.finish()  # not taken whole: closed, never reused mid-body
            _, again = await http.request_deferred("GET", f"{url}/big")
            assert again is not None and await _moved(again, [(0, again.length)]) == DATA
            again.finish()
        assert len(connections) == 2

    asyncio.run(_serve(handler, test))


@pytest.mark.parametrize("fault", ["closes", "stalls"])
def test_a_peer_that_closes_or_stalls_mid_body_fails_the_move(fault: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_head(len(LINE) + len(DATA)) + LINE + DATA[:1 << 20])  # a third of the body, then:
        await writer.drain()
        if fault == "stalls":
            await asyncio.sleep(5)
        writer.close()

    async def test(url: str) -> None:
        async with HttpClient(LeanTransport(timeout=0.5)) as http:
            _, body = await http.request_deferred("GET", f"{url}/big")
            assert body is not None
            with pytest.raises(SourceEnded if fault == "closes" else SpliceTimeout):
                await _moved(body, [(0, body.length)])
            body.finish()

    asyncio.run(_serve(handler, test))


class _UvicornLikeCycle:
    """What `relay.splicing` looks for under uvicorn's `send` (its `RequestResponseCycle`)."""

    def __init__(self) -> None:
        self.transport = object()
        self.expected_content_length = 0
        self.disconnected = False

    async def send(self, message: Message) -> None:
        pass


@pytest.mark.parametrize(("method", "scheme", "uvicorn", "offered"), [
    ("GET", "http", True, True),
    ("GET", "https", True, False),  # TLS: the kernel cannot splice into its records
    ("PUT", "http", True, False),
    ("GET", "http", False, False),  # another server (in-process tests): nothing to splice into
])
def test_the_splice_extension_is_offered_only_to_plain_gets_on_uvicorn(method: str, scheme: str, uvicorn: bool,
                                                                        offered: bool) -> None:
    seen: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(SPLICE in scope.get("extensions", {}))

    async def other_send(message: Message) -> None:
        pass

    async def receive() -> Message:
        return {}

    async def serve() -> None:
        await splicing(app)({"type": "http", "method": method, "scheme": scheme}, receive,
                            _UvicornLikeCycle().send if uvicorn else other_send)

    asyncio.run(serve())
    assert seen == [offered]
