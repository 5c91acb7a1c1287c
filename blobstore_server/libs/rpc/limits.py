"""Per-request limits every service applies before a route runs: header size, requests per second per
client address, and how long a client may pause while sending its body (a slow client ties up a
connection; it gets 408 instead). Body sizes are each route's own business (a shard's size is declared,
a signed control body is read whole only up to `MAX_SIGNED_BODY`)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field

from blobstore_server.libs.ratelimit import TokenBucket
from blobstore_server.libs.rpc.asgi import ASGIApp, Message, Receive, Scope, Send
from blobstore_server.libs.rpc.errors import HeadersTooLarge, RequestTimeout, RpcError, TooManyRequests

TRACKED_CLIENTS = 10_000  # client addresses whose rate is remembered; the longest quiet are forgotten first


class Limits(BaseModel):
    max_header_bytes: int = Field(16 << 10, ge=1024)
    client_rate: float | None = Field(None, gt=0)  # requests per second per client address; None: no cap
    client_burst: int = Field(200, ge=1)
    body_timeout: float = Field(30.0, gt=0)  # the longest pause between two pieces of a request body


class ClientRates:
    """A token bucket of requests per client address, for the most recently seen addresses."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def admit(self, client: str) -> bool:
        now = self.clock()
        bucket = self.buckets.pop(client, None) or TokenBucket(self.rate, self.burst, now)
        self.buckets[client] = bucket
        if len(self.buckets) > TRACKED_CLIENTS:
            self.buckets.popitem(last=False)
        bucket.take(1, now)
        if bucket.tokens < 0:  # no debt here: a refused request costs nothing
            bucket.tokens += 1
            return False
        return True


class Admission:
    """The checks made before any route runs, whichever protocol serves it: header size, the client's rate."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.rates = ClientRates(limits.client_rate, limits.client_burst) if limits.client_rate else None

    def refusal(self, header_bytes: int, client: str) -> RpcError | None:
        if header_bytes > self.limits.max_header_bytes:
            return HeadersTooLarge(f"{header_bytes} bytes of headers, at most {self.limits.max_header_bytes}")
        if self.rates is not None and not self.rates.admit(client):
            return TooManyRequests(f"more than {self.limits.client_rate:g} requests/s from {client}")
        return None


def limited(app: ASGIApp, admission: Admission, send_error: Callable[[Send, RpcError], Awaitable[None]]) -> ASGIApp:
    limits = admission.limits

    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        size = sum(len(k) + len(v) for k, v in scope.get("headers", []))
        refusal = admission.refusal(size, (scope.get("client") or ("?", 0))[0])
        if refusal is not None:
            await send_error(send, refusal)
            return

        answered = False  # by us, with 408: whatever the app sends after that goes nowhere
        started = False

        async def patient_receive() -> Message:
            nonlocal answered
            try:
                return await asyncio.wait_for(receive(), limits.body_timeout)
            except TimeoutError:
                if not started and not answered:
                    answered = True
                    await send_error(send, RequestTimeout(f"no body received for {limits.body_timeout:g}s"))
                return {"type": "http.disconnect"}  # the app stops reading, as if the client had left

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            started = True
            await send(message)

        await app(scope, patient_receive, tracked_send)

    return guard
