"""S3 requests as the gateway's operations get them, built without a wire or a signature: for unit tests of the
operations and of what a request declares."""

from __future__ import annotations

from collections.abc import AsyncIterator

from blobstore_server.services.s3.exchange import S3Request
from blobstore_server.services.s3.namespace import Bucket, User
from blobstore_server.services.s3.routing import route
from blobstore_server.services.s3.sigv4 import PayloadMode, Verified


async def _body(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


def s3_request(method: str, path: str, query: str = "", headers: dict[str, str] | None = None, body: bytes = b"",
               payload: PayloadMode = PayloadMode.UNSIGNED, bucket: Bucket | None = None) -> S3Request:
    """A request of the user alice (access key AK), routed as the gateway routes it; `headers` lower-case."""
    headers = headers or {}
    return S3Request(route(method, path, query, "x-amz-copy-source" in headers), headers, _body(body),
                     Verified("AK", payload, None, None), User("alice", "AK", 0), "REQ", bucket)
