"""A fault hook for tests, named as such: replies lost after their command committed.

A real lost reply (the connection breaks after the leader applied the command, before the answer
reaches the client) is a narrow window; this makes it happen on demand so that tests can show a
retry gets the first answer (client sessions) instead of applying twice. Enabled only by the
`fault_hooks` config switch, off by default; armed with `POST /fault/drop_reply` (`DropReplies`).
"""

from __future__ import annotations

import logging
from collections import Counter

from blobstore_server.libs.rpc.server import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class ReplyCutter:
    """Wraps the app: for an armed path, a successful reply's headers go out, then the connection is
    cut before the body, so the client sees the request fail after the server did the work."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.armed: Counter[str] = Counter()  # path -> replies still to cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self.armed[path]:
            await self.app(scope, receive, send)
            return

        async def cut(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.start" and message["status"] == 200 and self.armed[path] > 0:
                self.armed[path] -= 1
                log.warning("fault hook: cutting the reply to %s after its command committed", path)
                raise ConnectionAbortedError(f"fault hook: reply to {path} cut")

        await self.app(scope, receive, cut)
