"""Bucket operations: create, head, delete, the caller's buckets, listings, location and versioning."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from blobstore_server.services.s3 import replies
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.bodies import parse_create_bucket
from blobstore_server.services.s3.errors import NOT_CONFIGURED, S3Error
from blobstore_server.services.s3.exchange import S3Request, S3Response
from blobstore_server.services.s3.replies import ListParams
from blobstore_server.services.s3.routing import Op

Operation = Callable[[Backend, S3Request], Awaitable[S3Response]]


async def list_buckets(backend: Backend, request: S3Request) -> S3Response:
    buckets = await backend.db(backend.store.list_buckets, request.user.name)
    return S3Response.xml(replies.list_buckets(buckets, request.user.name))


async def create_bucket(backend: Backend, request: S3Request) -> S3Response:
    parse_create_bucket(await request.read_all(64 << 10))  # any region is this one
    await backend.db(backend.store.create_bucket, request.route.bucket, request.user.name)
    return S3Response(200, [("location", f"/{request.route.bucket}")])


async def head_bucket(backend: Backend, request: S3Request) -> S3Response:
    return S3Response(200, [("x-amz-bucket-region", backend.config.region)])


async def delete_bucket(backend: Backend, request: S3Request) -> S3Response:
    await backend.db(backend.store.delete_bucket, request.route.bucket)
    return S3Response(204)


async def bucket_location(backend: Backend, request: S3Request) -> S3Response:
    region = backend.config.region
    return S3Response.xml(replies.location_constraint("" if region == "us-east-1" else region))


async def bucket_versioning(backend: Backend, request: S3Request) -> S3Response:
    return S3Response.xml(replies.versioning_configuration())


async def bucket_configuration(backend: Backend, request: S3Request) -> S3Response:
    """GET of a configuration the gateway never holds (CORS, policy, tagging, ...): S3's answer for a bucket without
    one."""
    name = next(name for name in request.route.query if name in NOT_CONFIGURED)
    raise S3Error(NOT_CONFIGURED[name], f"The bucket has no {name} configuration (the gateway keeps none)",
                  request.route.resource)


async def list_objects(backend: Backend, request: S3Request) -> S3Response:
    """ListObjects v1 and v2, and ListObjectVersions (every object is its one "null" version)."""
    op, bucket = request.route.op, request.route.bucket
    params = ListParams.from_query(op, request.route.query)
    page = await backend.db(backend.store.list_objects, bucket, params.prefix, params.delimiter, params.after(),
                            params.max_keys)
    render = {Op.LIST_OBJECTS: replies.list_objects, Op.LIST_OBJECTS_V2: replies.list_objects_v2,
              Op.LIST_OBJECT_VERSIONS: replies.list_object_versions}[op]
    return S3Response.xml(render(bucket, params, page, request.owned_bucket.owner))


OPERATIONS: dict[Op, Operation] = {
    Op.LIST_BUCKETS: list_buckets,
    Op.CREATE_BUCKET: create_bucket,
    Op.HEAD_BUCKET: head_bucket,
    Op.DELETE_BUCKET: delete_bucket,
    Op.GET_BUCKET_LOCATION: bucket_location,
    Op.GET_BUCKET_VERSIONING: bucket_versioning,
    Op.GET_BUCKET_CONFIGURATION: bucket_configuration,
    Op.LIST_OBJECTS: list_objects,
    Op.LIST_OBJECTS_V2: list_objects,
    Op.LIST_OBJECT_VERSIONS: list_objects,
}
