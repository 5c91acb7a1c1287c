"""Service app factory: FastAPI for the control plane, leaner routes for the data path.

FastAPI's request/response machinery costs ~4x throughput on small bodies (measured here), so routes
that move object bytes are plain ASGI callables mounted beside the FastAPI app by `with_fast_routes`
(access), and the blobnode's shard routes are served by the lean protocol ahead of uvicorn
(`with_lean_routes`, `libs.rpc.lean_server`). All render errors the same way, from the one table in
`libs.rpc.errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar, cast

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel

from blobstore_server.libs.buffers import uninitialized
from blobstore_server.libs.openfiles import lift_open_file_limit
from blobstore_server.libs.rpc import auth, lean_server
from blobstore_server.libs.rpc.asgi import SPLICE_MESSAGE, ASGIApp, Message, Receive, Scope, Send
from blobstore_server.libs.rpc.auth import (
    AUTH_HEADER,
    CALLER_SCOPE_KEY,
    SESSION_HEADER,
    Signer,
    Verifier,
    address,
    check_target,
    query_pairs,
    required_capability,
)
from blobstore_server.libs.rpc.client import trust
from blobstore_server.libs.rpc.config import ConfigError, ServiceSettings, TLSConfig, auth_problem, load_config
from blobstore_server.libs.rpc.errors import BadRequest, Internal, LengthMismatch, RpcError, TooLarge
from blobstore_server.libs.rpc.lean_server import LeanHandler, Site, lean_protocol
from blobstore_server.libs.rpc.limits import Admission, limited
from blobstore_server.libs.rpc.metrics import INSECURE, SERVICE, Instrumented, Observer, Only, instrument, measuring
from blobstore_server.libs.rpc.relay import splicing
from blobstore_server.libs.rpc.routes import Route, RouteTable
from blobstore_server.libs.rpc.splice import BodySpan

log = logging.getLogger(__name__)
ConfigModel = TypeVar("ConfigModel", bound=BaseModel)

FastRoute = Callable[[Scope, Receive, Send], Awaitable[None]]
MAX_SIGNED_BODY = 16 << 20  # a control request's JSON; shard bytes are streamed, signed by length
TICK = 1.0  # seconds between the server loop's wakeups while nothing asks it to exit


def _validation_reason(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query"))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return "; ".join(parts) or "invalid request"


Hook = Callable[[], Awaitable[None]]

# Whether this process runs without auth on purpose (`insecure: true`): set by `run_service` before the app is
# built, so every service's /health reports it without each `build` passing it along.
_insecure = False


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def serves(app: FastAPI, route: Route) -> Callable[[Handler], Handler]:
    """Register the decorated handler as `route`, refusing (at start) one whose body or answer is not the model
    the declaration names: the declaration the client calls and auth checks is the one that runs."""

    def register(handler: Handler) -> Handler:
        hints = typing.get_type_hints(handler)
        answer = hints.get("return")
        if route.answer is not None and not (isinstance(answer, type) and issubclass(answer, route.answer)):
            raise TypeError(f"{route.method} {route.path} answers {route.answer.__name__}; "
                            f"{handler.__qualname__} returns {answer}")
        bodies = [t for name, t in hints.items() if name != "return" and isinstance(t, type)
                  and issubclass(t, BaseModel)]
        expected = [] if route.body is None else [route.body]
        if len(bodies) != len(expected) or not all(issubclass(b, e) for b, e in zip(bodies, expected, strict=True)):
            raise TypeError(f"{route.method} {route.path} takes {expected}; {handler.__qualname__} takes {bodies}")
        return app.api_route(route.path, methods=[route.method])(handler)

    return register


def create_app(title: str, *, on_start: Hook | None = None, on_stop: Hook | None = None,
               observers: Sequence[Observer] = ()) -> FastAPI:
    """A FastAPI app whose errors are `{"code", "error"}` JSON with the table's status; `on_start`
    and `on_stop` run inside the server's event loop around its life. Every request is measured
    (`libs.rpc.metrics`) and handed to each of `observers`; `/metrics` serves the figures."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if on_start is not None:
            await on_start()
        try:
            yield
        finally:
            if on_stop is not None:
                await on_stop()

    app = FastAPI(title=title, lifespan=lifespan)
    SERVICE.labels(title).set(1)
    if measuring(observers):
        app.add_middleware(Instrumented, observers=observers)
    app.state.observers = observers  # with_fast_routes hands its routes' requests to the same observers

    @app.get("/health")
    async def health() -> dict[str, str | bool]:
        return {"status": "ok", "insecure": True} if _insecure else {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        """Every sample, or with `name[]=...` (as Prometheus' own exporters take it) only the samples named."""
        names = request.query_params.getlist("name[]")
        return Response(generate_latest(Only(frozenset(names)) if names else REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(RpcError)
    async def _rpc_error(_: Request, exc: RpcError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(BadRequest(_validation_reason(exc)).to_json(), status_code=400)

    @app.exception_handler(json.JSONDecodeError)
    async def _bad_json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return JSONResponse(BadRequest(f"malformed JSON: {exc}").to_json(), status_code=400)

    return app


class _Template:
    """A fast route's key: `/exact/path` (any method; the handler checks it) or `METHOD /path/{name}`, whose
    `{name}` segments match one non-empty path segment each and reach the handler in `scope["path_params"]`."""

    def __init__(self, key: str) -> None:
        method, _, path = key.rpartition(" ")
        self.method = method or None
        self.path = path
        self.segments = path.split("/")

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if self.method is not None and method != self.method:
            return None
        if path == self.path:
            return {}
        parts = path.split("/")
        if len(parts) != len(self.segments):
            return None
        params = {}
        for want, got in zip(self.segments, parts, strict=True):
            if want.startswith("{") and want.endswith("}") and got:
                params[want[1:-1]] = got
            elif want != got:
                return None
        return params


def with_fast_routes(app: FastAPI, routes: Mapping[str, FastRoute]) -> ASGIApp:
    """Serve `routes` (see `_Template` for their keys) as bare ASGI handlers, measured like `app`'s own routes,
    and everything else through `app`."""
    observers = app.state.observers
    exact = {key: instrument(_rendering_errors(handler), key, observers)
             for key, handler in routes.items() if " " not in key}
    templated = [(_Template(key), instrument(_rendering_errors(handler), _Template(key).path, observers))
                 for key, handler in routes.items() if " " in key]

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            handler = exact.get(path)
            if handler is not None:
                await handler(scope, receive, send)
                return
            for template, served in templated:
                params = template.match(scope["method"], path)
                if params is not None:
                    scope["path_params"] = params
                    await served(scope, receive, send)
                    return
        await app(scope, receive, send)

    return dispatch


@dataclass(frozen=True)
class WithLeanRoutes:
    """A service's ASGI app and the routes the lean protocol (`libs.rpc.lean_server`) serves ahead of it; the app
    serves them too, through the same handlers, on connections handed over to uvicorn and in-process."""

    app: ASGIApp
    routes: Mapping[str, LeanHandler]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def with_lean_routes(app: FastAPI, routes: Mapping[str, LeanHandler]) -> WithLeanRoutes:
    """Serve `routes` (by exact path) with the lean protocol, and everything else through `app`."""
    return WithLeanRoutes(with_fast_routes(app, {path: asgi_handler(handler) for path, handler in routes.items()}),
                          routes)


def asgi_handler(handler: LeanHandler) -> FastRoute:
    """A lean route as a bare ASGI one."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = scope.get("query_string", b"").decode("latin-1")
        request = lean_server.Request(scope["method"], scope.get("path", ""), query, headers,
                                      scope.get(CALLER_SCOPE_KEY), lambda size: read_exact_body(receive, size))
        await handler(request, _AsgiResponder(send))

    return serve


@dataclass(frozen=True)
class _AsgiResponder:
    send: Send

    async def json(self, payload: BaseModel) -> None:
        await send_json(self.send, 200, payload)

    async def stream(self, length: int, pieces: AsyncIterator[bytes | memoryview], headers: Mapping[str, str]
                     ) -> None:
        await send_stream(self.send, length, pieces, headers)


def _rendering_errors(handler: FastRoute) -> ASGIApp:
    """`handler`, with its errors answered as `{"code", "error"}` JSON like FastAPI routes'."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await handler(scope, receive, tracking_send)
        except Exception as exc:
            if started:  # headers are out: only aborting the connection can signal the failure
                raise
            if not isinstance(exc, RpcError):
                log.exception("fast route %s failed", scope.get("path"))
                exc = Internal(f"{type(exc).__name__}: {exc}")
            await send_json(send, exc.status, exc.to_json(), exc.headers())

    return serve


def query_params(scope: Scope) -> dict[str, str]:
    return {name: value for name, value in query_pairs(scope.get("query_string", b"").decode("latin-1")) if value}


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (`name` in lower case, as ASGI gives them); None when absent."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def body_stream(receive: Receive) -> AsyncIterator[bytes]:
    """A request body as its pieces arrive; a client that goes away mid-body is a `LengthMismatch`."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise LengthMismatch("the client went away before its body ended")
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def int_param(params: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = params.get(name)
    if raw is None:
        if default is None:
            raise BadRequest(f"missing query parameter {name!r}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name!r} must be an integer, got {raw!r}") from None
    if value < 0:
        raise BadRequest(f"query parameter {name!r} must be >= 0, got {value}")
    return value


async def read_exact_body(receive: Receive, size: int) -> memoryview:
    """Read a request body that must be exactly `size` bytes, into one preallocated buffer."""
    view = uninitialized(size)  # filled in full, or refused
    got = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise LengthMismatch(f"client went away after {got} of {size} bytes")
        chunk = message.get("body", b"")
        if got + len(chunk) > size:
            raise LengthMismatch(f"body longer than the declared size {size}")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
        more = message.get("more_body", False)
    if got != size:
        raise LengthMismatch(f"body has {got} bytes, declared size is {size}")
    return view


async def send_json(send: Send, status: int, payload: BaseModel | dict[str, object],
                    headers: Mapping[str, str] | None = None, content_type: str = "application/json") -> None:
    body = payload.model_dump_json().encode() if isinstance(payload, BaseModel) else json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                            *((k.encode(), v.encode()) for k, v in (headers or {}).items())]})
    await send({"type": "http.response.body", "body": body})


async def send_stream(send: Send, length: int, pieces: AsyncIterator[bytes | bytearray | memoryview | BodySpan],
                      headers: Mapping[str, str] | None = None, status: int = 200) -> None:
    """Stream `length` bytes. The first piece is read before the status goes out, so most failures still
    get a clean error answer; one after the headers went out aborts the connection, so a client can never
    mistake a truncated body for a whole one. A `BodySpan` goes out as a `SPLICE_MESSAGE` (`libs.rpc.relay`):
    only a route offered that extension may yield one."""
    raw_headers = [(b"content-type", b"application/octet-stream"),
                   (b"content-length", str(length).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    piece = await anext(pieces, None)
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    while piece is not None:
        if isinstance(piece, BodySpan):
            await send({"type": SPLICE_MESSAGE, "span": piece})
        else:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        piece = await anext(pieces, None)
    await send({"type": "http.response.body", "body": b""})


class Lifecycle:
    """A service's background loops and the clients it must close, run inside the server's loop."""

    def __init__(self) -> None:
        self._loops: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._closers: list[Hook] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    def loop(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `run` from `start` on; a loop added after `start` begins at once."""
        self._loops.append(run)
        if self._started:
            self._tasks.append(asyncio.create_task(run()))

    def close(self, *closers: Hook) -> None:
        self._closers.extend(closers)

    async def start(self) -> None:
        self._started = True
        self._tasks = [asyncio.create_task(run()) for run in self._loops]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for close in self._closers:
            await close()


def run_service(name: str, model: type[ConfigModel], build: Callable[[ConfigModel], tuple[ASGIApp, str]], *,
                routes: RouteTable, public: bool = False) -> None:
    """The `python -m blobstore_server.services.<name> -c conf.json` entry point of every service: parse the flag,
    load and validate the config, set up logging, build the app and serve it on its address. With `auth` in
    the config, every request the service makes is signed and every request it serves is checked against
    `routes`, the service's own (`authenticated`), in a service whose API is `public` (access: the Location is the
    capability) only those to the routes declared there (access's undelete); the config's `limits` apply to every
    request (`libs.rpc.limits`).
    Without `auth` the service exits unless the config says `insecure: true` (then it warns and /health says so).
    The soft open-file limit is lifted to the hard one (`libs.openfiles`)."""
    global _insecure
    parser = argparse.ArgumentParser(prog=f"python -m blobstore_server.services.{name}")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    try:
        config = load_config(args.config, model)
    except ConfigError as exc:
        sys.exit(f"{name}: refusing to start: {exc}")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(name)s %(message)s")
    settings = config if isinstance(config, ServiceSettings) else ServiceSettings()
    sys.setswitchinterval(settings.gil_switch_ms / 1000)
    problem = auth_problem(settings, args.config, name)
    if problem is not None:
        sys.exit(f"{name}: refusing to start: {problem}")
    if settings.insecure:
        _insecure = True
        INSECURE.set(1)
        if settings.auth is None:
            log.warning("INSECURE: %s runs without auth (`insecure: true` in %s): every route is open to anyone who "
                        "reaches it and nothing it sends is signed", name, args.config)
        else:
            log.warning("INSECURE: %s leaves open (`insecure: true` in %s): %s", name, args.config,
                        "; ".join(settings.open_links()))
    if settings.auth is not None:
        auth.install(Signer.from_config(settings.auth))
    if settings.tls is not None:
        trust(settings.tls.ca_file)
    lift_open_file_limit()
    app, bind_addr = build(config)
    verifier = Verifier(settings.auth, routes) if settings.auth is not None else None
    names = frozenset(n.lower() for n in settings.auth.names) if settings.auth is not None else frozenset()
    admission = Admission(settings.limits)
    lean = (Site(app.routes, admission, None if public else verifier, names, routes.streamed)
            if isinstance(app, WithLeanRoutes) else None)
    if verifier is not None:
        app = authenticated(app, verifier, names=names, public=public)
    serve(limited(app, admission, _send_error), bind_addr, settings.tls, lean)


def authenticated(app: ASGIApp, verifier: Verifier, max_body: int = MAX_SIGNED_BODY,
                  names: Iterable[str] = (), public: bool = False) -> ASGIApp:
    """`app` behind signature checks, made before the body reaches a route: the body is read (at most
    `max_body` bytes) to check its digest, then handed on; a streamed shard body is not read here. A request's
    Host must be the address it arrived at or one of `names` (host:port others reach this service by), so a
    request signed for one service is refused by every other. `public`: only the verifier's declared routes are
    checked."""
    names = frozenset(n.lower() for n in names)

    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or required_capability(verifier.routes, path, public) is None:
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", []) if k in _GUARDED}
        try:
            declared = int(headers["content-length"]) if "content-length" in headers else None
            body: bytes | None = None
            read = False
            if path not in verifier.routes.streamed:
                if declared is not None and declared > max_body:
                    raise TooLarge(f"a signed request body may hold {max_body} bytes, not {declared}")
                if not declared and "transfer-encoding" not in headers:
                    body = b""  # no body by HTTP's rules or an empty one: nothing to read (most GETs)
                else:
                    body, read = await _read_body(receive, max_body), True
            target = headers.get("host", "").lower()
            check_target(target, names, address(scope.get("server")))
            scope[CALLER_SCOPE_KEY] = verifier.check(scope["method"], path,
                                                     scope.get("query_string", b"").decode("latin-1"),
                                                     headers.get(AUTH_HEADER), body, declared, target,
                                                     headers.get(SESSION_HEADER, ""))
        except RpcError as exc:
            await _send_error(send, exc)
            return
        await app(scope, _replay(body, receive) if read and body is not None else receive, send)

    return guard


_GUARDED = frozenset(name.encode() for name in ("content-length", "transfer-encoding", "host", AUTH_HEADER,
                                                 SESSION_HEADER))


async def _send_error(send: Send, exc: RpcError) -> None:
    await send_json(send, exc.status, exc.to_json(), exc.headers())


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("the client went away before sending its body")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise TooLarge(f"a signed request body may hold {limit} bytes")
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the already read body once, then waits on the connection as before."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def serve(app: ASGIApp, bind_addr: str, tls: TLSConfig | None = None, lean: Site | None = None) -> None:
    """Run the app under uvicorn (httptools + uvloop) until SIGTERM/SIGINT, over HTTPS with `tls`; `lean`'s
    routes through the lean protocol."""
    host, _, port = bind_addr.rpartition(":")
    config = uvicorn.Config(splicing(app), host=host or "127.0.0.1", port=int(port),
                            # uvicorn takes any protocol class; a BufferedProtocol is one, though not asyncio.Protocol
                            http="httptools" if lean is None else cast(type[asyncio.Protocol], lean_protocol(lean)),
                            loop="uvloop", access_log=False, log_level="warning", proxy_headers=False,
                            timeout_keep_alive=30, ssl_certfile=tls.cert_file if tls else None,
                            ssl_keyfile=tls.key_file if tls else None)
    QuietServer(config).run()  # runs on uvloop (asyncio.run of serve() would not: the loop is chosen in run)


class QuietServer(uvicorn.Server):
    """uvicorn's server, waking once a second instead of ten times.

    uvicorn's main loop sleeps 0.1 s at a time to notice an exit signal; in every process of an idle cluster
    those ten wakeups a second were most of its CPU. Here the signal handler wakes the loop itself, and the
    once-a-second tick only renews the Date header (to the second, as before).
    """

    _exit_asked: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop, self._exit_asked = asyncio.get_running_loop(), asyncio.Event()
        while not await self.on_tick(0):  # counter 0: each tick renews the Date header
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), TICK)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._exit_asked is not None:
            self._loop.call_soon_threadsafe(self._exit_asked.set)
