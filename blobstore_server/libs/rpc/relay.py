"""Relaying bytes from a blobnode's answer to a client's connection inside the kernel: the `SPLICE` ASGI extension.

uvicorn's connections are plain Python objects under the ASGI `send` it gives an app. Where a GET arrived over
plain TCP (scheme http: no TLS), `splicing` offers the extension in the scope and serves `SPLICE_MESSAGE`s itself:
once the bytes sent before it have left the loop, it moves the span's bytes (`splice.SocketBody.move`) from the
blobnode's socket to a `dup` of the client's, then tells uvicorn's cycle they were sent, as if written through it,
so its Content-Length accounting holds. Anything unexpected in uvicorn's objects turns the extension off, never on.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from prometheus_client import Counter

from blobstore_server.libs.rpc.asgi import SPLICE, SPLICE_MESSAGE, ASGIApp, Message, Receive, Scope, Send
from blobstore_server.libs.rpc.splice import AVAILABLE, BodySpan

FLUSH_POLL = 0.001  # seconds between looks at bytes still queued in the loop before a move
SPLICED = Counter("blobstore_spliced_bytes", "Response bytes relayed from peers' answers to clients inside the kernel "
                  "(splice), never copied through this process")


class _Cycle:
    """uvicorn's `RequestResponseCycle` of one request, as far as a move needs it."""

    def __init__(self, cycle: Any, transport: Any) -> None:
        self.cycle = cycle
        self.transport = transport

    @classmethod
    def of(cls, send: Send) -> _Cycle | None:
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        if (transport is None or not isinstance(getattr(cycle, "expected_content_length", None), int)
                or not isinstance(getattr(cycle, "disconnected", None), bool)):
            return None
        return cls(cycle, transport)

    async def move(self, span: BodySpan) -> None:
        """Send `span` to the client; its body is finished after its last span, or when this fails."""
        try:
            await self._flushed(span.body.timeout)
            destination = os.dup(self.transport.get_extra_info("socket").fileno())
            try:
                await span.body.move(span, destination)
            finally:
                os.close(destination)
        except BaseException:
            span.body.finish()
            raise
        self.cycle.expected_content_length -= len(span)
        SPLICED.inc(len(span))
        if span.stop == span.body.length:
            span.body.finish()

    async def _flushed(self, timeout: float) -> None:
        """Until the bytes written through uvicorn before the move have left the loop's buffer."""
        waited = 0.0
        while self.transport.get_write_buffer_size():
            if self.cycle.disconnected or self.transport.is_closing():
                raise ConnectionResetError("the client went away")
            if waited > timeout:
                raise TimeoutError(f"the client took nothing for {timeout:g} s")
            await asyncio.sleep(FLUSH_POLL)
            waited += FLUSH_POLL
        if self.cycle.disconnected:
            raise ConnectionResetError("the client went away")


def splicing(app: ASGIApp) -> ASGIApp:
    """`app`, offered the `SPLICE` extension on requests whose connection allows it."""
    if not AVAILABLE:
        return app

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        plain_get = scope["type"] == "http" and scope.get("method") == "GET" and scope.get("scheme") == "http"
        cycle = _Cycle.of(send) if plain_get else None  # https: TLS, whose bytes the kernel cannot splice
        if cycle is None:
            await app(scope, receive, send)
            return
        scope.setdefault("extensions", {})[SPLICE] = {}

        async def splicing_send(message: Message) -> None:
            if message["type"] == SPLICE_MESSAGE:
                await cycle.move(message["span"])
            else:
                await send(message)

        await app(scope, receive, splicing_send)

    return serve
