"""S3 requests as the gateway's operations get them, built without a wire or a signature: for unit tests of the
operations and of what a request declares."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from blobstore import AsyncClient
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.config import S3Config
from blobstore_server.services.s3.exchange import S3Request, S3Response
from blobstore_server.services.s3.namespace import Bucket, NamespaceStore, User
from blobstore_server.services.s3.operations import OPERATIONS
from blobstore_server.services.s3.routing import route
from blobstore_server.services.s3.sigv4 import PayloadMode, Verified

UNREACHABLE = "http://127.0.0.1:1"  # the blob store of `perform`: an operation that reaches it fails


async def _body(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


def s3_request(method: str, path: str, query: str = "", headers: dict[str, str] | None = None, body: bytes = b"",
               payload: PayloadMode = PayloadMode.UNSIGNED, bucket: Bucket | None = None) -> S3Request:
    """A request of the user alice (access key AK), routed as the gateway routes it; `headers` lower-case."""
    headers = headers or {}
    return S3Request(route(method, path, query, "x-amz-copy-source" in headers), headers, _body(body),
                     Verified("AK", payload, None, None), User("alice", "AK", 0), "REQ", bucket)


def perform(store: NamespaceStore, request: S3Request) -> S3Response:
    """The request's operation on `store`, with no blob store behind it (the request's bucket is the caller's)."""
    async def run() -> S3Response:
        async with AsyncClient(UNREACHABLE) as sdk:
            backend = Backend(store, sdk, S3Config(access_hosts=[UNREACHABLE]))
            return await OPERATIONS[request.route.op](backend, request)
    return asyncio.run(run())
