"""A fake transport for tests of the policy above a client (leader following, retries, host choice).

Named as a fake on purpose: it never stands in for a real service in a test that claims durability or
behaviour on the wire; those start real processes. A handler gets each `Request` and returns a
`FakeReply`, or raises `Unavailable` to play an unreachable peer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from pydantic import BaseModel

from blobstore_server.libs.rpc.client import Request
from blobstore_server.libs.rpc.errors import RpcError

Handler = Callable[[Request], Awaitable["FakeReply"]]


@dataclass
class FakeReply:
    status: int = 200
    body: bytes = b""

    @classmethod
    def of(cls, answer: BaseModel | RpcError) -> FakeReply:
        """The reply a real service gives for a model or a typed error."""
        if isinstance(answer, RpcError):
            return cls(answer.status, json.dumps(answer.to_json()).encode())
        return cls(200, answer.model_dump_json().encode())

    async def read(self) -> bytes:
        return self.body

    async def iter_chunked(self, size: int) -> AsyncIterator[bytes]:
        for start in range(0, len(self.body), size):
            yield self.body[start:start + size]


class FakeTransport:
    """Answers every request from `handler` in-process and records what was asked (`requests`)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    @asynccontextmanager
    async def send(self, request: Request) -> AsyncIterator[FakeReply]:
        self.requests.append(request)
        yield await self.handler(request)

    async def close(self) -> None:
        return None
