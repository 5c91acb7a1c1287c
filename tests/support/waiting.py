"""The one way a test waits for something: poll a condition with a deadline (never a bare sleep)."""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from blobstore_server.libs.rpc import errors

T = TypeVar("T")


@overload
async def eventually(check: Callable[[], Awaitable[T]], timeout: float, what: str = ..., every: float = ...) -> T: ...
@overload
async def eventually(check: Callable[[], T], timeout: float, what: str = ..., every: float = ...) -> T: ...


async def eventually(check: Callable[[], Any], timeout: float, what: str = "the condition", every: float = 0.1) -> Any:
    """Poll `check` (plain or async) until it returns a truthy value, and return that value; fail after `timeout`
    seconds naming `what` and the last answer. An RPC error counts as "not yet": a service may be restarting."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            answer = check()
            last = await answer if inspect.isawaitable(answer) else answer
            if last:
                return last
        except errors.RpcError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")
        await asyncio.sleep(every)
