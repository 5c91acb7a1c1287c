"""The ASGI callable types, shared by the app factory and the request instrumentation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# An ASGI extension of this project's server (`libs.rpc.relay`): where `scope["extensions"]` holds SPLICE, a route
# may send {"type": SPLICE_MESSAGE, "span": splice.BodySpan} among its body messages, bytes moved from a peer's socket
# to the client's without passing through the process.
SPLICE = "blobstore.splice"
SPLICE_MESSAGE = "blobstore.response.splice"
