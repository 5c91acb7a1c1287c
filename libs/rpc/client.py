"""The one HTTP transport every service client sits on: aiohttp with a shared pool.

aiohttp sustains ~10k req/s at 32 concurrent requests here against ~400 for httpx's own pool
(NOTES.md), and an access PUT fans out to N+M blobnodes at once. Non-2xx answers come back as the
typed error the peer raised; a connection failure or timeout is `Unavailable`.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Self

import aiohttp

from libs.rpc.errors import Unavailable, error_from_response

Params = Mapping[str, str | int]


class HttpClient:
    """An aiohttp session created lazily inside the running loop; safe to share across tasks."""

    def __init__(self, *, timeout: float = 30.0, connect_timeout: float = 3.0, pool_size: int = 512) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                                  auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @staticmethod
    async def _raise_for(resp: aiohttp.ClientResponse) -> None:
        if resp.status < 300:
            return
        try:
            body: object = await resp.json(content_type=None)
        except (ValueError, aiohttp.ClientError):
            body = None
        raise error_from_response(resp.status, body)

    async def call(self, method: str, url: str, *, params: Params | None = None,
                   json: object = None, data: bytes | bytearray | memoryview | None = None,
                   timeout: float | None = None) -> Any:
        """One request whose answer is JSON (or empty)."""
        kwargs: dict[str, Any] = {"params": _str_params(params)}
        if json is not None:
            kwargs["json"] = json
        if data is not None:
            kwargs["data"] = data
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self._get_session().request(method, url, **kwargs) as resp:
                await self._raise_for(resp)
                raw = await resp.read()
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise Unavailable(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if not raw:
            return None
        return jsonlib.loads(raw)

    async def read(self, url: str, *, params: Params | None = None, timeout: float | None = None) -> bytes:
        """GET a whole binary body; a short body (peer aborted mid-stream) is `Unavailable`."""
        return b"".join([piece async for piece in self.stream(url, params=params, timeout=timeout)])

    async def stream(self, url: str, *, params: Params | None = None, piece: int = 1 << 20,
                     timeout: float | None = None) -> AsyncIterator[bytes]:
        kwargs: dict[str, Any] = {"params": _str_params(params)}
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self._get_session().get(url, **kwargs) as resp:
                await self._raise_for(resp)
                async for chunk in resp.content.iter_chunked(piece):
                    yield chunk
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise Unavailable(f"GET {url}: {type(exc).__name__}: {exc}") from exc


def _str_params(params: Params | None) -> dict[str, str] | None:
    # int() first: int subclasses such as Vuid may print as something other than digits.
    return None if params is None else {k: str(int(v)) if isinstance(v, int) else v for k, v in params.items()}


class ServiceClient:
    """Base of every service's client: one shared `HttpClient`, closed with the client."""

    def __init__(self, http: HttpClient | None = None, timeout: float = 30.0) -> None:
        self.http = http or HttpClient(timeout=timeout)

    async def close(self) -> None:
        await self.http.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
