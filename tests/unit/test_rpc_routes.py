"""Fast-route dispatch: exact paths, method + template keys, and everything else to the FastAPI app."""

from __future__ import annotations

import asyncio

from blobstore_server.libs.rpc.asgi import Message, Receive, Scope, Send
from blobstore_server.libs.rpc.server import create_app, send_json, with_fast_routes


def _call(app, method: str, path: str, query: bytes = b"") -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": [],
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


def test_metrics_gives_only_the_samples_named() -> None:
    """The dashboard asks each process for the few samples it reads, not the whole text."""
    app = create_app("test")

    def names(text: bytes) -> set[str]:
        return {line.split("{")[0].split(" ")[0] for line in text.decode().splitlines() if not line.startswith("#")}

    status, everything = _call(app, "GET", "/metrics")
    assert status == 200 and {"process_cpu_seconds_total", "python_info"} < names(everything)
    # requests in flight come from a collector that names its samples only when it runs (register_collector)
    wanted = {"process_cpu_seconds_total", "python_info", "blobstore_http_requests_in_flight"}
    status, some = _call(app, "GET", "/metrics", "&".join(f"name[]={name}" for name in sorted(wanted)).encode())
    assert status == 200 and names(some) == wanted
