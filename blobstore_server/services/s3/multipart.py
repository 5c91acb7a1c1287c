"""Multipart uploads: create, upload a part (streamed, or copied from an object), complete (the parts' manifests
joined, no bytes copied), abort, list parts and uploads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from blobstore_server.services.s3 import replies
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.bodies import MAX_BODY, parse_complete
from blobstore_server.services.s3.checksums import NOT_COMPOSED, algorithm_named
from blobstore_server.services.s3.copying import copy_bytes, copy_source, source_range
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.exchange import S3Request, S3Response
from blobstore_server.services.s3.headers import meta_from_headers
from blobstore_server.services.s3.namespace import Upload
from blobstore_server.services.s3.namespace.completion import check_part_number
from blobstore_server.services.s3.objects import store_body, write_condition
from blobstore_server.services.s3.replies import ListParams
from blobstore_server.services.s3.routing import Op

Operation = Callable[[Backend, S3Request], Awaitable[S3Response]]


def _number(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit():
        raise S3Error("InvalidArgument", f"{name} must be a non-negative integer, not {raw!r}")
    return int(raw)


def _checksum_headers(headers: dict[str, str]) -> list[tuple[str, str]]:
    """What CreateMultipartUpload answers to x-amz-checksum-algorithm (the aws CLI sends CRC32): the algorithm and
    the one checksum type the gateway gives a multipart object, COMPOSITE (checksums.composite)."""
    name = headers.get("x-amz-checksum-algorithm", "").strip()
    if not name:
        return []
    algorithm = algorithm_named(name)
    if algorithm in NOT_COMPOSED:  # S3's only type for it; each part's is checked, the object gets none yet
        return [("x-amz-checksum-algorithm", algorithm.upper()), ("x-amz-checksum-type", "FULL_OBJECT")]
    if headers.get("x-amz-checksum-type", "COMPOSITE").strip().upper() != "COMPOSITE":
        raise S3Error("NotImplemented", "multipart objects get COMPOSITE checksums only, not FULL_OBJECT ones")
    return [("x-amz-checksum-algorithm", algorithm.upper()), ("x-amz-checksum-type", "COMPOSITE")]


async def _upload(backend: Backend, request: S3Request) -> Upload:
    """The request's upload: an upload id is its key's, so under any other key it is NoSuchUpload, as S3 answers."""
    route = request.route
    upload = await backend.db(backend.store.get_upload, route.bucket, route.query["uploadId"])
    if upload.key != route.key:
        raise S3Error("NoSuchUpload", "The specified upload does not exist: its key is another one",
                      route.query["uploadId"])
    return upload


async def create_upload(backend: Backend, request: S3Request) -> S3Response:
    route = request.route
    checksum_headers = _checksum_headers(request.headers)
    upload = await backend.db(backend.store.create_upload, route.bucket, route.key, request.user.name,
                              meta_from_headers(request.headers))
    return S3Response.xml(replies.initiate_multipart_upload(route.bucket, route.key, upload.id),
                          headers=checksum_headers)


async def upload_part(backend: Backend, request: S3Request) -> S3Response:
    """UploadPart and UploadPartCopy: the part's bytes stored, recorded under the upload (a part sent again
    replaces the old one, whose Locations go to the GC outbox)."""
    route, store = request.route, backend.store
    number = _number(route.query, "partNumber", 0)
    check_part_number(number)  # before any byte is stored
    upload = await _upload(backend, request)
    copy = route.op is Op.UPLOAD_PART_COPY
    source = await copy_source(backend, request) if copy else None
    intent = store.begin_intent(request.owned_bucket, upload.key)
    try:
        if source is not None:
            first, last = source_range(request.headers.get("x-amz-copy-source-range"), source.record.size)
            manifest, md5_hex = await copy_bytes(backend, source.record, first, last, intent)
            checksums: dict[str, str] = {}
        else:
            manifest, md5_hex, checksums = await store_body(backend, request, intent)
        size = sum(extent.size for extent in manifest)
        part = await backend.db(store.put_part, route.bucket, upload.id, number, size, md5_hex, manifest,
                                intent, checksums)
    except BaseException:
        await asyncio.shield(backend.db(store.abandon_intent, intent))
        raise
    if copy:
        return S3Response.xml(replies.copy_part_result(part.etag, part.last_modified_ms))
    return S3Response(200, [("etag", f'"{part.etag}"'), *checksums.items()])


async def complete_upload(backend: Backend, request: S3Request) -> S3Response:
    route = request.route
    parts = parse_complete(await request.read_all(MAX_BODY))
    await _upload(backend, request)
    record = await backend.db(backend.store.complete_upload, route.bucket, route.query["uploadId"], parts,
                              write_condition(request.headers))
    location = f"{backend.config.advertised_host}{route.resource}"
    return S3Response.xml(replies.complete_multipart_upload(location, route.bucket, route.key, record.etag,
                                                            record.checksums))


async def abort_upload(backend: Backend, request: S3Request) -> S3Response:
    await _upload(backend, request)
    await backend.db(backend.store.abort_upload, request.route.bucket, request.route.query["uploadId"])
    return S3Response(204)


async def list_parts(backend: Backend, request: S3Request) -> S3Response:
    route = request.route
    marker, most = _number(route.query, "part-number-marker", 0), min(_number(route.query, "max-parts", 1000), 1000)
    await _upload(backend, request)
    page = await backend.db(backend.store.list_parts, route.bucket, route.query["uploadId"], marker, most)
    return S3Response.xml(replies.list_parts(route.bucket, page, marker, most))


async def list_uploads(backend: Backend, request: S3Request) -> S3Response:
    route = request.route
    params = ListParams.from_query(route.op, route.query)
    page = await backend.db(backend.store.list_uploads, route.bucket, params.prefix, params.delimiter, params.marker,
                            params.upload_id_marker, params.max_keys)
    return S3Response.xml(replies.list_multipart_uploads(route.bucket, params, page))


OPERATIONS: dict[Op, Operation] = {
    Op.CREATE_MULTIPART_UPLOAD: create_upload,
    Op.UPLOAD_PART: upload_part,
    Op.UPLOAD_PART_COPY: upload_part,
    Op.COMPLETE_MULTIPART_UPLOAD: complete_upload,
    Op.ABORT_MULTIPART_UPLOAD: abort_upload,
    Op.LIST_PARTS: list_parts,
    Op.LIST_MULTIPART_UPLOADS: list_uploads,
}
