"""S3 over HTTP: each request is verified (SigV4), routed to its operation and answered in S3's terms.
Unsigned GETs of /health and /metrics are the service's own (an anonymous S3 request is refused anyway)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.types import ASGIApp, Receive, Scope, Send

from blobstore.errors import BlobstoreError, Unavailable
from blobstore_server.libs.rpc.metrics import instrument
from blobstore_server.libs.rpc.server import Lifecycle, create_app
from blobstore_server.services.s3 import sigv2
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.exchange import S3Request, S3Response
from blobstore_server.services.s3.namespace import Credentials
from blobstore_server.services.s3.operations import perform
from blobstore_server.services.s3.routing import path_style, route
from blobstore_server.services.s3.sigv4 import WireRequest, verify

log = logging.getLogger(__name__)
INTERNAL = ("/health", "/metrics")


@dataclass(frozen=True)
class _Measured:
    path: str


def _signed(scope: Scope) -> bool:
    query = scope.get("query_string", b"")
    return any(k == b"authorization" for k, _ in scope["headers"]) or b"X-Amz-Signature=" in query


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if (name == b"content-length" and value.strip() not in (b"", b"0")) or name == b"transfer-encoding":
            return True
    return False


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise S3Error("IncompleteBody", "the client went away before its body ended")
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body", False):
            return


async def _request(backend: Backend, scope: Scope, receive: Receive, request_id: str) -> S3Request:
    """Verify and route what came in; AccessDenied for anonymous requests (no public buckets yet)."""
    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    raw_path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    host = next((value for name, value in pairs if name.lower() == "host"), "")
    path = path_style(host, raw_path, backend.config.domains)
    signer: list[Credentials] = []  # who the signature check found: the request's user, without a second lookup

    def secret_for(access_key: str) -> str | None:
        found = backend.credentials(access_key)
        signer.extend([found] if found is not None else [])
        return None if found is None else found.secret

    v2 = sigv2.presigned(query)  # SigV4 signs the path as sent, SigV2 the bucket and key whatever the style
    wire = WireRequest(scope["method"], path if v2 else raw_path, query, pairs)
    verified = await asyncio.to_thread(sigv2.verify if v2 else verify, wire, secret_for, datetime.now(UTC))
    headers: dict[str, str] = {}
    for name, value in pairs:
        headers[name.lower()] = f"{headers[name.lower()]},{value}" if name.lower() in headers else value
    routed = route(scope["method"], path, query, "x-amz-copy-source" in headers)
    scope["route"] = _Measured(f"S3 {routed.op.value}")  # the request metrics' route label
    if verified.anonymous or verified.access_key is None:
        raise S3Error("AccessDenied", "anonymous requests are not served: sign with an access key", routed.resource)
    if not signer:
        raise S3Error("InvalidAccessKeyId", "the access key was removed", routed.resource)
    return S3Request(routed, headers, _body(receive), verified, signer[-1].user, request_id)


async def _send(send: Send, response: S3Response, head: bool, request_id: str, started: list[bool]) -> None:
    """The answer; a streamed body's first piece is read before the status goes out, so a blob store that fails
    at once still gets a clean error answer (`started` turns true once the status is out)."""
    headers = [("x-amz-request-id", request_id), ("x-amz-id-2", request_id), *response.headers]
    body, first = response.body, b""
    if isinstance(body, bytes):
        length = response.length if head and response.length is not None else len(body)
    else:
        length = response.length or 0
        first = bytes(await anext(body, b"")) if not head else b""
    if response.status not in (204, 304):
        headers.append(("content-length", str(length)))
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": response.status, "headers": raw})
    started[0] = True
    if head or response.status in (204, 304):
        await send({"type": "http.response.body", "body": b""})
    elif isinstance(body, bytes):
        await send({"type": "http.response.body", "body": body})
    else:
        await send({"type": "http.response.body", "body": first, "more_body": True})
        async for piece in body:
            await send({"type": "http.response.body", "body": bytes(piece), "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _error(exc: Exception) -> S3Error:
    if isinstance(exc, S3Error):
        return exc
    if isinstance(exc, Unavailable):
        return S3Error("ServiceUnavailable", f"the blob store is unavailable: {exc}")
    if isinstance(exc, BlobstoreError):
        return S3Error("InternalError", f"the blob store answered: {exc}")
    log.exception("an S3 request failed")
    return S3Error("InternalError", f"{type(exc).__name__}: {exc}")


def build_app(backend: Backend, life: Lifecycle) -> ASGIApp:
    internal = create_app("s3", on_start=life.start, on_stop=life.stop)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "GET" and scope["path"] in INTERNAL
                                       and not _signed(scope)):
            await internal(scope, receive, send)
            return
        await measured(scope, receive, send)

    async def s3(scope: Scope, receive: Receive, send: Send) -> None:
        request_id = secrets.token_hex(8).upper()
        head = scope["method"] == "HEAD"
        started = [False]
        try:
            request = await _request(backend, scope, receive, request_id)
            await _send(send, await perform(backend, request), head, request_id, started)
        except Exception as exc:
            if started[0]:
                raise  # the status is out: only dropping the connection tells the client
            error = _error(exc)
            answer = (S3Response.xml(error.to_xml(request_id), error.status) if not head and error.status != 304
                      else S3Response(error.status))
            answer.headers.extend(error.headers)
            if _has_body(scope):
                # what is left of the body is not read (a client waiting on 100-continue never sends it): the
                # connection closes after the answer, or those bytes would be read as the next request
                answer.headers.append(("connection", "close"))
            await _send(send, answer, head, request_id, started)

    measured = instrument(s3)  # by operation: the route label is "S3 <operation>"
    return app
