"""The one HTTP client every service client sits on: typed calls over a narrow transport seam.

`HttpClient` applies policy (status -> typed error, JSON -> model); a `Transport` does the I/O. The
real transport is aiohttp with a shared pool: it sustains ~10k req/s at 32 concurrent requests here
against ~400 for httpx's own pool (measured on a 2-core machine), and an access PUT fans out to N+M blobnodes at once.
`libs.rpc.testing.FakeTransport` answers in-process, so policy above a client is tested in
milliseconds. Non-2xx answers come back as the typed error the peer raised; a connection failure or
timeout is `Unreachable` (an `Unavailable`).
"""

from __future__ import annotations

import json as jsonlib
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, Self, TypeVar, runtime_checkable

import aiohttp
import yarl
from pydantic import BaseModel, ValidationError

from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import AUTH_HEADER, SESSION_HEADER
from blobstore_server.libs.rpc.errors import Internal, Unreachable, error_from_response
from blobstore_server.libs.rpc.routes import NO_ROUTES, Route, RouteTable
from blobstore_server.libs.rpc.splice import SocketBody

Params = Mapping[str, str | int]
Body = bytes | bytearray | memoryview
M = TypeVar("M", bound=BaseModel)
JSON_TYPE = "application/json"


@dataclass
class Request:
    method: str
    url: str
    params: dict[str, str] | None = None
    body: Body | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None


Payload = bytes | memoryview  # an answer's body; a memoryview is read-only and its buffer the caller's alone


class Response(Protocol):
    status: int

    async def read(self) -> Payload: ...

    def iter_chunked(self, size: int) -> AsyncIterator[bytes]: ...


class Transport(Protocol):
    """Sends one request; raises `Unreachable` when the peer cannot be reached or times out, also while
    the body is being read."""

    def send(self, request: Request) -> AbstractAsyncContextManager[Response]: ...

    async def close(self) -> None: ...


@runtime_checkable
class DeferringTransport(Transport, Protocol):
    """A transport that can leave the bulk of an answer in its socket, to be moved on without a copy."""

    async def send_deferred(self, request: Request) -> tuple[int, Payload, SocketBody | None]: ...


_trusted: ssl.SSLContext | None = None


def trust(ca_file: str | None, pem: str | None = None) -> None:
    """Verify `https://` peers against `ca_file` (the cluster's CA), or the certificate text `pem` (where the file
    is on another machine: a Spark executor's), instead of the system's roots, in every transport created from now
    on; neither: the system's roots again."""
    global _trusted
    _trusted = ssl.create_default_context(cafile=ca_file, cadata=pem) if ca_file or pem else None


def trusted() -> ssl.SSLContext | None:
    """The context `trust` set up; None: the system's roots."""
    return _trusted


class AiohttpTransport:
    """aiohttp with one session created lazily inside the running loop; safe to share across tasks."""

    def __init__(self, *, timeout: float = 30.0, connect_timeout: float = 3.0, pool_size: int = 512) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=0, ttl_dns_cache=300,
                                             ssl=_trusted if _trusted is not None else True)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=False)
        return self._session

    @asynccontextmanager
    async def send(self, request: Request) -> AsyncIterator[Response]:
        kwargs: dict[str, Any] = {"params": request.params, "headers": request.headers}
        if request.body is not None:
            kwargs["data"] = request.body
        if request.timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=request.timeout)
        try:
            url = yarl.URL(request.url, encoded=True)  # sent as signed: never requoted
            async with self._get_session().request(request.method, url, **kwargs) as resp:
                yield _AiohttpResponse(resp)
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise Unreachable(f"{request.method} {request.url}: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.status = resp.status
        self._resp = resp

    async def read(self) -> bytes:
        return await self._resp.read()

    def iter_chunked(self, size: int) -> AsyncIterator[bytes]:
        return self._resp.content.iter_chunked(size)


class HttpClient:
    """Typed requests over a transport (aiohttp unless another is given), signed (when this process signs) for
    what `routes`, those of the service called, say each path takes (a path declared in none takes `admin`)."""

    def __init__(self, transport: Transport | None = None, *, routes: RouteTable = NO_ROUTES,
                 timeout: float = 30.0, connect_timeout: float = 3.0, pool_size: int = 512) -> None:
        self.routes = routes
        self.transport = transport or AiohttpTransport(timeout=timeout, connect_timeout=connect_timeout,
                                                       pool_size=pool_size)
        # Asked once: isinstance against a runtime-checkable Protocol walks its members (~8% of access's Python
        # time on 16 MiB GETs when asked per request).
        self._deferring = self.transport if isinstance(self.transport, DeferringTransport) else None

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @staticmethod
    async def _raise_for(resp: Response) -> None:
        if resp.status >= 300:
            _raise_error(resp.status, await resp.read())

    async def request(self, method: str, url: str, *, params: Params | None = None, json: object = None,
                      data: Body | None = None, headers: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> Payload:
        """One request; the answer's raw body. `json` is a model or (for tests of bad input) any JSON value."""
        request = Request(method, _with_params(url, params), None, data, dict(headers or {}), timeout=timeout)
        if json is not None:
            request.body = json.model_dump_json().encode() if isinstance(json, BaseModel) else jsonlib.dumps(
                json).encode()
            request.headers["content-type"] = JSON_TYPE
        _sign(request, self.routes)
        async with self.transport.send(request) as resp:
            await self._raise_for(resp)
            return await resp.read()

    async def request_deferred(self, method: str, url: str, *, params: Params | None = None,
                               timeout: float | None = None) -> tuple[Payload, SocketBody | None]:
        """A request without a body whose answer may stay mostly in its socket: (its whole body, None), or, from a
        `DeferringTransport`, possibly (the body's first line, the rest as a `splice.SocketBody` to move on and
        finish)."""
        if self._deferring is None:
            return await self.request(method, url, params=params, timeout=timeout), None
        request = Request(method, _with_params(url, params), timeout=timeout)
        _sign(request, self.routes)
        status, received, rest = await self._deferring.send_deferred(request)
        if status >= 300:
            _raise_error(status, received)
        return received, rest

    async def call(self, method: str, url: str, response: type[M], *, params: Params | None = None,
                   body: BaseModel | None = None, data: Body | None = None, headers: Mapping[str, str] | None = None,
                   timeout: float | None = None) -> M:
        """One request whose answer is the JSON of `response`."""
        raw = await self.request(method, url, params=params, json=body, data=data, headers=headers, timeout=timeout)
        try:
            return response.model_validate_json(bytes(raw))  # no copy unless the transport gave a view
        except ValidationError as exc:
            raise Internal(f"{method} {url} answered something that is not a {response.__name__}: {exc}") from None

    async def call_route(self, route: Route[M], host: str, *, params: Params | None = None,
                         body: BaseModel | None = None, data: Body | None = None,
                         headers: Mapping[str, str] | None = None, timeout: float | None = None) -> M:
        """`route` (its declaration in libs/proto) on `host`: the body it declares sent, the answer it declares
        returned."""
        if route.answer is None or (body is None) != (route.body is None) or (
                route.body is not None and not isinstance(body, route.body)):
            raise TypeError(f"{route.method} {route.path} takes {route.body} and answers {route.answer}; "
                            f"called with {type(body).__name__}")
        return await self.call(route.method, f"{host}{route.path}", route.answer, params=params, body=body, data=data,
                               headers=headers, timeout=timeout)

    async def read(self, url: str, *, params: Params | None = None, timeout: float | None = None) -> bytes:
        """GET a whole binary body; a short body (peer aborted mid-stream) is `Unavailable`."""
        return b"".join([piece async for piece in self.stream(url, params=params, timeout=timeout)])

    async def stream(self, url: str, *, params: Params | None = None, piece: int = 1 << 20,
                     timeout: float | None = None) -> AsyncIterator[bytes]:
        request = Request("GET", _with_params(url, params), timeout=timeout)
        _sign(request, self.routes)
        async with self.transport.send(request) as resp:
            await self._raise_for(resp)
            async for chunk in resp.iter_chunked(piece):
                yield chunk


def _raise_error(status: int, raw: Payload) -> NoReturn:
    try:
        body: object = jsonlib.loads(bytes(raw)) if raw else None
    except ValueError:
        body = None
    raise error_from_response(status, body)


def _sign(request: Request, routes: RouteTable) -> None:
    """Add the process's signature (`libs.rpc.auth`), if it signs."""
    signer = auth.installed()
    if signer is not None and AUTH_HEADER not in request.headers:
        request.headers[AUTH_HEADER] = signer.header(request.method, request.url, request.params, request.body,
                                                     routes, request.headers.get(SESSION_HEADER, ""))


def presigned(method: str, url: str, params: Params | None, routes: RouteTable) -> tuple[str, dict[str, str]]:
    """A body-less request to one of `routes` for another to send once: its URL (`params` in the query) and
    headers, signed by this process if it signs. What the signature allows is that one request, within the
    verifier's window."""
    request = Request(method, _with_params(url, params))
    _sign(request, routes)
    return request.url, request.headers


def _with_params(url: str, params: Params | None) -> str:
    """`url` with `params` urlencoded into its query: what is signed is then exactly what every transport sends."""
    if not params:
        return url
    # int() first: int subclasses such as Vuid may print as something other than digits.
    query = auth.encode_query({k: str(int(v)) if isinstance(v, int) else v for k, v in params.items()})
    return f"{url}&{query}" if "?" in url else f"{url}?{query}"


class ServiceClient:
    """Base of every service's client: one shared `HttpClient`, closed with the client, signing for `routes`, the
    service's (an `http` given signs for its own)."""

    def __init__(self, routes: RouteTable, http: HttpClient | None = None, timeout: float = 30.0) -> None:
        self.http = http or HttpClient(routes=routes, timeout=timeout)

    async def close(self) -> None:
        await self.http.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
