"""A lean HTTP/1.1 server protocol for the shard data path (blobnode `/shard/put`, `/shard/get`).

Under uvicorn a shard request went through its request cycle and Task, then four ASGI layers (limits, metrics,
error rendering, auth) each wrapping `send` and `receive`: about half of a blobnode's CPU per shard request
(issue 29's profile). This protocol serves the routes it is given in one pass: the head parsed once; limits,
auth, dispatch, metrics and error rendering inline; the body received (`BufferedProtocol`) straight into the
buffer the route asks for; each answer written with one call.

Whatever it does not serve in full (another path, a chunked body, `Expect`, HTTP/1.0, HEAD, an odd or oversized
head) hands the connection over for good, with the bytes read so far, to uvicorn's own protocol: the control
plane and unusual clients keep uvicorn's exact behaviour, and there the routes given here are served by the same
handlers through `server.asgi_handler`. A handler sees a `Request` and answers through a `Responder`, whichever
protocol carries them.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from pydantic import BaseModel
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from blobstore_server.libs.buffers import uninitialized
from blobstore_server.libs.rpc.auth import (
    AUTH_HEADER,
    SESSION_HEADER,
    Caller,
    Verifier,
    address,
    check_target,
    query_pairs,
)
from blobstore_server.libs.rpc.errors import Internal, LengthMismatch, RequestTimeout, RpcError
from blobstore_server.libs.rpc.limits import Admission
from blobstore_server.libs.rpc.metrics import ENABLED, STATS

log = logging.getLogger(__name__)

HEAD_BUFFER = 64 << 10  # request heads, and body bytes that arrive before the route asks for them
JSON = b"application/json"
OCTETS = b"application/octet-stream"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in http.HTTPStatus}


class Request:
    """A request as a route sees it: `params` are the query's non-empty values, `headers` have lower-case names."""

    __slots__ = ("_read_body", "caller", "headers", "method", "params", "path", "query")

    def __init__(self, method: str, path: str, query: str, headers: Mapping[str, str], caller: Caller | None,
                 read_body: Callable[[int], Awaitable[memoryview]]) -> None:
        self.method, self.path, self.query, self.headers, self.caller = method, path, query, headers, caller
        self.params = {name: value for name, value in query_pairs(query) if value}
        self._read_body = read_body

    async def body(self, size: int) -> memoryview:
        """The whole body, which must be `size` bytes (`LengthMismatch` otherwise), in one buffer."""
        return await self._read_body(size)


class Responder(Protocol):
    """How a route answers: once, with a JSON model or with a stream of exactly `length` bytes."""

    async def json(self, payload: BaseModel) -> None: ...

    async def stream(self, length: int, pieces: AsyncIterator[bytes | memoryview], headers: Mapping[str, str]
                     ) -> None: ...


LeanHandler = Callable[[Request, Responder], Awaitable[None]]


@dataclass(frozen=True)
class Site:
    """What the lean protocol serves (routes by exact path), which of them take a streamed body (the rest take
    none here), and how it admits a request; `verifier` None: no auth."""

    routes: Mapping[str, LeanHandler]
    admission: Admission
    verifier: Verifier | None = None
    names: frozenset[str] = frozenset()
    streamed: frozenset[str] = frozenset()


def lean_protocol(site: Site) -> type[LeanConnection]:
    """The protocol class to give uvicorn (`Config(http=...)`) to serve `site` this way."""
    return cast(type[LeanConnection], type("LeanProtocol", (LeanConnection,), {"site": site}))


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]] | None:
    """Method, path, query and headers of a plain HTTP/1.1 request head; None for anything else (duplicate or
    folded headers, another version), which uvicorn then judges."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name[:1] in b" \t" or name[-1:] in b" \t":
            return None
        key = name.decode("latin-1").lower()
        if key in headers:
            return None
        headers[key] = value.strip(b" \t").decode("latin-1")
    path, _, query = parts[1].decode("latin-1").partition("?")
    return parts[0].decode("latin-1"), path, query, headers


class LeanConnection(asyncio.BufferedProtocol):
    """One client connection. Requests are answered one at a time; bytes of the next (pipelined) request wait
    in the head buffer, and reading pauses while it is full."""

    site: ClassVar[Site]

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._uvicorn = (config, server_state, app_state, _loop)  # to hand the connection over
        self.connections: set[Any] = server_state.connections  # uvicorn's graceful shutdown walks these
        self.keep_alive_timeout: float = config.timeout_keep_alive
        self.body_timeout = self.site.admission.limits.body_timeout
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.local = self.client = ""
        self.head = bytearray(HEAD_BUFFER)
        self.start = self.filled = 0  # the unparsed bytes are head[start:filled]
        self.body: memoryview | None = None  # a body being received into its own buffer
        self.body_got = 0
        self.body_waiter: asyncio.Future[None] | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.busy = False  # a request is being answered
        self.unread = 0  # bytes of its body still to come off the stream
        self.keep_alive = True
        self.paused = False
        self.writable: asyncio.Future[None] | None = None
        self.idle: asyncio.TimerHandle | None = None
        self.lost = False
        self.task: asyncio.Task[None] | None = None  # the request being answered

    # asyncio.BufferedProtocol, called by uvicorn's server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.connections.add(self)
        self.local = address(transport.get_extra_info("sockname"))
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if peer else "?"

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.connections.discard(self)
        for timer in (self.idle, self.body_timer):
            if timer is not None:
                timer.cancel()
        if self.body_waiter is not None and not self.body_waiter.done():
            self.body_waiter.set_exception(LengthMismatch(
                f"the client went away after {self.body_got} of {len(self.body or b'')} bytes"))
        if self.writable is not None and not self.writable.done():
            self.writable.set_exception(ConnectionResetError("the client went away"))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None:
            return self.body[self.body_got:]
        if len(self.head) - self.filled < 4096:
            self._compact()
        return memoryview(self.head)[self.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.body is not None:
            self.body_got += nbytes
            self.unread -= nbytes
            if self.body_got == len(self.body):
                self.body = None
                if self.body_waiter is not None and not self.body_waiter.done():
                    self.body_waiter.set_result(None)
            return
        self.filled += nbytes
        if self.busy:
            if self.filled - self.start >= HEAD_BUFFER:
                self._pause()
            return
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self._next_request()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    def shutdown(self) -> None:
        """uvicorn's graceful stop: close now if idle, else after the answer in progress."""
        self.keep_alive = False
        if not self.busy and self.transport is not None:
            self.transport.close()

    # the request cycle

    def _compact(self) -> None:
        if self.start:
            kept = self.filled - self.start
            self.head[:kept] = self.head[self.start:self.filled]
            self.start, self.filled = 0, kept
        if len(self.head) - self.filled < 4096:
            self.head.extend(bytes(HEAD_BUFFER))

    def _pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def _next_request(self) -> None:
        end = self.head.find(b"\r\n\r\n", self.start, self.filled)
        if end < 0:
            if self.filled - self.start > self.site.admission.limits.max_header_bytes:
                self._hand_over()  # too long a head: uvicorn and `limited` refuse it as they do any other
            return
        parsed = _parse_head(bytes(self.head[self.start:end]))
        if parsed is None:
            self._hand_over()
            return
        method, path, query, headers = parsed
        handler = self.site.routes.get(path)
        length = headers.get("content-length", "0")
        if (handler is None or method == "HEAD" or "transfer-encoding" in headers or "expect" in headers
                or "upgrade" in headers or not length.isdigit() or len(length) > 18
                or (int(length) and path not in self.site.streamed)):  # a signed body is hashed: uvicorn reads it
            self._hand_over()
            return
        self.start = end + 4
        self.busy = True
        self.unread = int(length)
        if headers.get("connection", "").lower() == "close":
            self.keep_alive = False
        self.task = self.loop.create_task(self._answer(handler, method, path, query, headers))

    def _hand_over(self) -> None:
        config, server_state, app_state, loop = self._uvicorn
        protocol = HttpToolsProtocol(config, server_state, app_state, loop)
        transport = self.transport
        assert transport is not None
        self.connections.discard(self)
        protocol.connection_made(transport)
        transport.set_protocol(protocol)
        protocol.data_received(bytes(self.head[self.start:self.filled]))

    async def _answer(self, handler: LeanHandler, method: str, path: str, query: str,
                      headers: dict[str, str]) -> None:
        began = time.perf_counter()
        STATS.in_flight += 1
        writer = _Writer(self)
        try:
            refusal = self.site.admission.refusal(sum(len(k) + len(v) for k, v in headers.items()), self.client)
            if refusal is not None:
                raise refusal
            caller = None
            if self.site.verifier is not None:
                target = headers.get("host", "").lower()
                check_target(target, self.site.names, self.local)
                caller = self.site.verifier.check(method, path, query, headers.get(AUTH_HEADER),
                                                  None if path in self.site.streamed else b"", self.unread, target,
                                                  headers.get(SESSION_HEADER, ""))
            await handler(Request(method, path, query, headers, caller, self._read_body), writer)
            if not writer.started:
                raise Internal(f"{path} answered nothing")
        except Exception as exc:
            if writer.started or self.lost:  # headers are out: only aborting the connection can signal it
                if not self.lost:
                    log.warning("lean route %s failed mid-answer: %s", path, exc)
                    self.keep_alive = False
                    assert self.transport is not None
                    self.transport.abort()
            else:
                if not isinstance(exc, RpcError):
                    log.exception("lean route %s failed", path)
                    exc = Internal(f"{type(exc).__name__}: {exc}")
                writer.status = exc.status
                self.write(exc.status, JSON, exc.headers(), json.dumps(exc.to_json()).encode())
        finally:
            STATS.in_flight -= 1
            if ENABLED:
                STATS.record(path, method, writer.status, time.perf_counter() - began)
            self._finish()

    def write(self, status: int, content_type: bytes, headers: Mapping[str, str], body: bytes | memoryview,
              length: int = -1) -> None:
        """The status and headers, then `body`; `length` (the whole body's, when more follows) defaults to it."""
        if self.lost:
            return  # nobody to tell
        if self.unread and self.unread > self.filled - self.start:
            self.keep_alive = False  # an unread body still on its way: the connection cannot carry another request
        head = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode(), b"content-type: ",
                content_type, b"\r\ncontent-length: ", str(len(body) if length < 0 else length).encode(), b"\r\n"]
        head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
        head.append(b"\r\n" if self.keep_alive else b"connection: close\r\n\r\n")
        assert self.transport is not None
        self.transport.writelines((b"".join(head), body))

    async def drained(self) -> None:
        if self.lost:
            raise ConnectionResetError("the client went away")
        if self.writable is not None:
            await self.writable

    async def _read_body(self, size: int) -> memoryview:
        if size != self.unread:
            raise LengthMismatch(f"body has {self.unread} bytes, declared size is {size}")
        body = uninitialized(size)  # every byte of it is received into it
        taken = min(size, self.filled - self.start)
        body[:taken] = self.head[self.start:self.start + taken]
        self.start += taken
        self.unread -= taken
        if taken == size:
            return body
        if self.lost:
            raise LengthMismatch(f"the client went away after {taken} of {size} bytes")
        self.body, self.body_got = body, taken
        self.body_waiter = self.loop.create_future()
        self.body_timer = self.loop.call_later(self.body_timeout, self._check_body, taken)
        self._resume()
        try:
            await self.body_waiter
        finally:
            self.body_waiter = None
            if self.body_timer is not None:
                self.body_timer.cancel()
        return body

    def _check_body(self, got_before: int) -> None:
        """A body that made no progress in `body_timeout` fails its request with 408 (`limits.Limits`)."""
        if self.body is None or self.body_waiter is None or self.body_waiter.done():
            return
        if self.body_got == got_before:
            self.body_waiter.set_exception(RequestTimeout(f"no body received for {self.body_timeout:g}s"))
            return
        self.body_timer = self.loop.call_later(self.body_timeout, self._check_body, self.body_got)

    def _finish(self) -> None:
        """After an answer: skip a body the route left unread if it is all here, then serve what comes next."""
        self.busy = False
        self.body = None
        if self.unread and self.unread <= self.filled - self.start:
            self.start += self.unread
            self.unread = 0
        if self.lost or self.transport is None:
            return
        if not self.keep_alive:
            self.transport.close()
            return
        if self.start == self.filled:
            self.start = self.filled = 0
        self._resume()
        if self.filled > self.start:
            self._next_request()
        else:
            self.idle = self.loop.call_later(self.keep_alive_timeout, self.transport.close)


class _Writer:
    """The lean protocol's `Responder`."""

    def __init__(self, connection: LeanConnection) -> None:
        self.connection = connection
        self.started = False
        self.status = 500  # what a route that failed without answering amounts to

    async def json(self, payload: BaseModel) -> None:
        self.started, self.status = True, 200
        self.connection.write(200, JSON, {}, payload.model_dump_json().encode())

    async def stream(self, length: int, pieces: AsyncIterator[bytes | memoryview], headers: Mapping[str, str]
                     ) -> None:
        first = await anext(pieces, b"")  # read before the status goes out: most failures still get a clean answer
        self.started, self.status = True, 200
        self.connection.write(200, OCTETS, headers, first, length)
        async for piece in pieces:
            await self.connection.drained()
            assert self.connection.transport is not None
            self.connection.transport.write(piece)
