"""Fast-route dispatch: exact paths, method + template keys, and everything else to the FastAPI app."""

from __future__ import annotations

import asyncio

from blobstore_server.libs.rpc.asgi import Message, Receive, Scope, Send
from blobstore_server.libs.rpc.server import create_app, send_json, with_fast_routes


def _call(app, method: str, path: str) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": [],
             "http_version": "1.1", "scheme": "http", "root_path": "", "server": ("127.0.0.1", 1),
             "client": ("127.0.0.1", 2)}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def _answer(name: str):  # type: ignore[no-untyped-def]
    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"route": name, **scope.get("path_params", {})})

    return route


def test_templates_match_method_and_segments() -> None:
    fastapi = create_app("test")

    @fastapi.get("/blob/{token}/stat")
    async def stat(token: str) -> dict[str, str]:
        return {"route": "fastapi stat", "token": token}

    app = with_fast_routes(fastapi, {"/shard/put": _answer("exact"), "PUT /blob": _answer("put"),
                                     "GET /blob/{token}": _answer("get")})
    assert _call(app, "POST", "/shard/put") == (200, b'{"route": "exact"}')  # exact keys take any method
    assert _call(app, "PUT", "/blob") == (200, b'{"route": "put"}')
    assert _call(app, "GET", "/blob/abc") == (200, b'{"route": "get", "token": "abc"}')
    assert _call(app, "GET", "/blob/abc/stat") == (200, b'{"route":"fastapi stat","token":"abc"}')
    assert _call(app, "DELETE", "/blob/abc")[0] == 404  # the template takes GET only; the rest goes to FastAPI
    assert _call(app, "GET", "/blob/")[0] == 404  # a {name} segment is never empty
    assert _call(app, "GET", "/blob")[0] == 404
