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


async def perform(backend: Backend, request: S3Request) -> S3Response:
    op = request.route.op
    operation = OPERATIONS.get(op)
    if operation is None:
        raise S3Error("NotImplemented", f"{op.value} is not supported yet", request.route.resource)
    if op not in UNOWNED:
        bucket = await backend.db(backend.store.get_bucket, request.route.bucket)
        if bucket.owner != request.user.name:
            raise S3Error("AccessDenied", f"bucket {bucket.name} is not yours", request.route.resource)
        request.bucket = bucket
    return await operation(backend, request)
