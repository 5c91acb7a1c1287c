"""Which function performs each S3 operation, after the one check they share: a bucket's operations are its
owner's (others get AccessDenied)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from blobstore_server.services.s3 import buckets, multipart, objects
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.exchange import S3Request, S3Response
from blobstore_server.services.s3.routing import Op

Operation = Callable[[Backend, S3Request], Awaitable[S3Response]]

OPERATIONS: dict[Op, Operation] = {**buckets.OPERATIONS, **objects.OPERATIONS, **multipart.OPERATIONS}
UNOWNED = frozenset({Op.LIST_BUCKETS, Op.CREATE_BUCKET})  # no bucket of the caller's to look up first

# Request headers that ask for what the gateway does not do, and the values of each that ask for nothing: a 200 to
# any other would claim it done (bytes kept as if encrypted under the client's key or KMS, a lock that is not held).
# SSE-S3 (AES256) is taken: clients set up for it send it on every PUT, and no answer claims it back (none carries
# x-amz-server-side-encryption).
UNSUPPORTED_HEADERS: dict[str, frozenset[str]] = {
    "x-amz-server-side-encryption": frozenset({"aes256"}),
    "x-amz-server-side-encryption-customer-algorithm": frozenset(),
    "x-amz-copy-source-server-side-encryption-customer-algorithm": frozenset(),
    "x-amz-object-lock-mode": frozenset(),
    "x-amz-object-lock-retain-until-date": frozenset(),
    "x-amz-object-lock-legal-hold": frozenset({"off"}),
    "x-amz-bucket-object-lock-enabled": frozenset({"false"}),
}


def refuse_unsupported(headers: dict[str, str], resource: str) -> None:
    """NotImplemented when a header asks for what the gateway does not do (UNSUPPORTED_HEADERS)."""
    for name, harmless in UNSUPPORTED_HEADERS.items():
        value = headers.get(name)
        if value is not None and value.strip().lower() not in harmless:
            raise S3Error("NotImplemented", f"{name}: {value} is not supported", resource)


async def perform(backend: Backend, request: S3Request) -> S3Response:
    op = request.route.op
    refuse_unsupported(request.headers, request.route.resource)
    operation = OPERATIONS.get(op)
    if operation is None:
        raise S3Error("NotImplemented", f"{op.value} is not supported yet", request.route.resource)
    if op not in UNOWNED:
        bucket = await backend.db(backend.store.get_bucket, request.route.bucket)
        if bucket.owner != request.user.name:
            raise S3Error("AccessDenied", f"bucket {bucket.name} is not yours", request.route.resource)
        request.bucket = bucket
    return await operation(backend, request)
