"""A lean HTTP/1.1 transport for the shard path: keep-alive connections, bodies read straight into one buffer.

A 10 KiB access PUT makes six shard requests and a GET three; through aiohttp each costs ~0.1-0.15 ms of
access CPU (URL objects, timers, tracing hooks, stream readers, a join of the body's pieces), more than
the blobnode's own route. This transport does only what the blobnode's shard routes need: one request
at a time per connection, a `Content-Length` on every answer, the body received by `BufferedProtocol`
into a buffer allocated once per answer and never zero-filled (the kernel copies into it; nothing is
joined), handed out as a read-only memoryview. It implements
`libs.rpc.client.Transport`, so policy (signing, typed errors) stays in `HttpClient`. A connection the
peer closed while idle is noticed on reuse and the request sent once more on a fresh one; an answer
without `Content-Length` is refused (`Internal`) rather than guessed at.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from blobstore_server.libs.buffers import uninitialized
from blobstore_server.libs.rpc import client
from blobstore_server.libs.rpc.auth import encode_query
from blobstore_server.libs.rpc.client import Payload, Request
from blobstore_server.libs.rpc.errors import Internal, Unreachable
from blobstore_server.libs.rpc.splice import SocketBody

MAX_HEAD = 64 << 10  # status line and headers of an answer


@dataclass(frozen=True)
class _Peer:
    host: str
    port: int
    tls: bool


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; `exchange` sends a request and waits for its whole answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self._head = bytearray(MAX_HEAD)
        self._head_len = 0
        self._spare = bytearray(4096)
        self._spilled = False
        self._body: memoryview | None = None
        self._body_len = 0
        self._status = 0
        self._close_after = False
        self._done: asyncio.Future[tuple[int, memoryview]] | None = None
        self._lost: Exception | None = None
        self._defer = False  # an answer of 200 stops after the first line of its body (`exchange`)
        self._length = 0  # the answer's Content-Length
        self._body_start = 0  # while deferring: where the body begins in `_head`, once the head is parsed
        self.unread = 0  # bytes of a deferred body still in the socket

    # asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def get_buffer(self, sizehint: int) -> memoryview:
        self._spilled = False
        if self._body is not None and self._body_len < len(self._body):
            return self._body[self._body_len:]
        if self._body is None and self._head_len < MAX_HEAD:
            return memoryview(self._head)[self._head_len:]
        self._spilled = True  # bytes past the answer, or headers too long: buffer_updated fails the exchange
        return memoryview(self._spare)

    def buffer_updated(self, nbytes: int) -> None:
        if self._spilled or self._done is None or self._done.done():
            self._fail(Internal("the peer sent more than the answer, or headers longer than "
                                f"{MAX_HEAD} bytes"))
            return
        if self._body is not None:
            self._body_len += nbytes
        else:
            self._head_len += nbytes
            if self._body_start:
                self._first_line()
                return
            end = self._head.find(b"\r\n\r\n", 0, self._head_len)
            if end < 0:
                return
            try:
                self._parse_head(bytes(self._head[:end]))
            except Internal as exc:
                self._fail(exc)
                return
            if self._defer and self._status == 200:
                self._body_start = end + 4
                self._first_line()
                return
            self._body = uninitialized(self._length)
            extra = self._head_len - end - 4
            if extra > len(self._body):
                self._fail(Internal("the answer is longer than its Content-Length"))
                return
            self._body[:extra] = self._head[end + 4:self._head_len]
            self._body_len = extra
        if self._body_len == len(self._body):
            self._done.set_result((self._status, self._body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._lost = exc or ConnectionResetError("the peer closed the connection")
        self._fail(self._lost)

    def eof_received(self) -> bool:
        return False  # close our side too

    # the exchange

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise Internal(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        length: int | None = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip()) if value.strip().isdigit() else None
            elif name == "connection" and value.strip().lower() == "close":
                self._close_after = True
            elif name == "transfer-encoding":
                raise Internal("a chunked answer on the shard path")
        if length is None:
            raise Internal("an answer without a valid Content-Length on the shard path")
        self._status = int(parts[1])
        self._length = length

    def _first_line(self) -> None:
        """Deferring: once the body's first line (or all of a shorter body) is here, stop reading and answer with
        the body bytes received; the rest (`unread`) stays in the socket for `SocketBody`."""
        assert self._done is not None and self.transport is not None
        got = self._head_len - self._body_start
        if got > self._length:
            self._fail(Internal("the answer is longer than its Content-Length"))
            return
        if got < self._length and self._head.find(b"\n", self._body_start, self._head_len) < 0:
            return
        self.unread = self._length - got
        if self.unread:
            self.transport.pause_reading()
        self._done.set_result((self._status, memoryview(self._head)[self._body_start:self._head_len].toreadonly()))

    def _fail(self, exc: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    async def exchange(self, head: bytes, body: client.Body | None, defer: bool = False) -> tuple[int, memoryview]:
        """Send a request and wait for its answer: all of it, or with `defer` of a 200 only its body's first line
        (and whatever came with it), the other `unread` bytes left in the socket, read paused, the connection
        not reusable until `resume`."""
        assert self.transport is not None
        self.reusable = False
        self._head_len, self._body, self._body_len, self._close_after = 0, None, 0, False
        self._defer, self._body_start, self.unread = defer, 0, 0
        self._done = asyncio.get_running_loop().create_future()
        try:
            self.transport.writelines([head, body] if body else [head])
        except RuntimeError as exc:  # uvloop: the handle closed before connection_lost told us (a reset peer)
            raise ConnectionResetError(f"the connection closed under the request: {exc}") from exc
        status, answer = await self._done
        self.reusable = not self._close_after and not self.unread
        return status, answer

    def time_out(self) -> None:
        """The answer took too long: the exchange waiting for it raises `TimeoutError`."""
        if self._done is not None and not self._done.done():
            self._done.set_exception(TimeoutError())

    def fileno(self) -> int:
        assert self.transport is not None
        return cast(int, self.transport.get_extra_info("socket").fileno())

    def resume(self) -> None:
        """The deferred body was taken off the socket by someone else: the connection serves the next request."""
        assert self.transport is not None
        self.unread = 0
        self.reusable = not self._close_after and self.open()
        self.transport.resume_reading()

    def open(self) -> bool:
        return self._lost is None and self.transport is not None and not self.transport.is_closing()

    def received_nothing(self) -> bool:
        return self._head_len == 0 and self._body is None

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


class _Answer:
    """The whole answer, already read (`client.Response`)."""

    def __init__(self, status: int, body: memoryview) -> None:
        self.status = status
        self._body = body.toreadonly()  # the connection never writes a whole answer's buffer again

    async def read(self) -> memoryview:
        return self._body

    async def iter_chunked(self, size: int) -> AsyncIterator[bytes]:
        for start in range(0, len(self._body), size):
            yield self._body[start:start + size]  # type: ignore[misc]


class LeanTransport:
    """Keep-alive connections per peer, at most `max_idle` idle ones kept per peer."""

    def __init__(self, *, timeout: float = 30.0, connect_timeout: float = 3.0, max_idle: int = 64) -> None:
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: dict[_Peer, list[_Connection]] = {}
        self._peers: dict[str, tuple[_Peer, str]] = {}  # "scheme://host:port" -> peer, Host header value

    def _peer(self, url: str) -> tuple[_Peer, str, str]:
        """(peer, Host header, path) of `url`."""
        scheme_end = url.index("://") + 3
        path_start = url.find("/", scheme_end)
        base, path = (url, "/") if path_start < 0 else (url[:path_start], url[path_start:])
        known = self._peers.get(base)
        if known is None:
            parts = urlsplit(base)
            if parts.scheme not in ("http", "https") or parts.hostname is None:
                raise ValueError(f"not an http(s) URL: {url}")
            tls = parts.scheme == "https"
            known = (_Peer(parts.hostname, parts.port or (443 if tls else 80), tls), parts.netloc)
            self._peers[base] = known
        return known[0], known[1], path

    async def _connect(self, peer: _Peer) -> _Connection:
        context: ssl.SSLContext | None = None
        if peer.tls:
            context = client.trusted() or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(_Connection, peer.host, peer.port, ssl=context)
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"cannot connect to {peer.host}:{peer.port}: {type(exc).__name__}: {exc}") from exc
        return conn

    def _reusable(self, peer: _Peer) -> _Connection | None:
        """An idle connection still open; those the peer closed meanwhile are dropped."""
        idle = self._idle.get(peer)
        while idle:
            conn = idle.pop()
            if conn.open():
                return conn
            conn.close()
        return None

    def _release(self, peer: _Peer, conn: _Connection) -> None:
        idle = self._idle.setdefault(peer, [])
        if conn.reusable and len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()

    @asynccontextmanager
    async def send(self, request: Request) -> AsyncIterator[client.Response]:
        peer, conn, answer = await self._exchange(request, defer=False)
        self._release(peer, conn)
        yield _Answer(*answer)

    async def send_deferred(self, request: Request) -> tuple[int, Payload, SocketBody | None]:
        """`request`, answered with its status and its whole body; or, for a 200 over plain TCP whose body did not
        all come with its first line, that line (newline included) and the rest as a `SocketBody`, which holds the
        connection until it is finished."""
        peer, conn, (status, received) = await self._exchange(request, defer=not self._peer(request.url)[0].tls)
        if not conn.unread:
            self._release(peer, conn)
            return status, bytes(received), None  # the connection's buffer serves its next answer
        line = bytes(received).find(b"\n") + 1
        timeout = request.timeout if request.timeout is not None else self._timeout
        return status, received[:line], SocketBody(received[line:], conn.fileno(), conn.unread,
                                                   lambda whole: self._settle(peer, conn, whole), timeout)

    def _settle(self, peer: _Peer, conn: _Connection, taken: bool) -> None:
        if taken:
            conn.resume()
            self._release(peer, conn)
        else:
            conn.close()

    async def _exchange(self, request: Request, defer: bool) -> tuple[_Peer, _Connection, tuple[int, memoryview]]:
        peer, host, path = self._peer(request.url)
        target = f"{path}?{encode_query(request.params)}" if request.params else path
        lines = [f"{request.method} {target} HTTP/1.1", f"host: {host}",
                 f"content-length: {0 if request.body is None else memoryview(request.body).nbytes}",
                 *(f"{k}: {v}" for k, v in request.headers.items())]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        timeout = request.timeout if request.timeout is not None else self._timeout
        fresh = False  # after a reused connection failed: a new one, never another idle one
        while True:
            conn = None if fresh else self._reusable(peer)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(peer)
            timer = asyncio.get_running_loop().call_later(timeout, conn.time_out)  # cheaper than asyncio.timeout
            try:
                answer = await conn.exchange(head, request.body, defer)
            except TimeoutError:
                conn.close()
                raise Unreachable(f"{request.method} {request.url}: no answer within {timeout} s") from None
            except OSError as exc:
                conn.close()
                if reused and conn.received_nothing():  # the peer had closed it while it was idle
                    fresh = True
                    continue
                raise Unreachable(f"{request.method} {request.url}: {type(exc).__name__}: {exc}") from exc
            except BaseException:
                conn.close()
                raise
            finally:
                timer.cancel()
            return peer, conn, answer

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
