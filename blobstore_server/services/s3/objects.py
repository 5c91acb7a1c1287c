"""Object operations: PUT (streamed to the blob store, committed once every digest checked), GET and HEAD
(conditionals, one range), DELETE."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from blobstore_server.services.s3 import replies
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.bodies import MAX_BODY, parse_delete
from blobstore_server.services.s3.conditions import byte_range, check_read, part_range
from blobstore_server.services.s3.copying import copied_checksums, copy_bytes, copy_source
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.exchange import Body, S3Request, S3Response
from blobstore_server.services.s3.headers import (
    meta_from_headers,
    not_modified_headers,
    object_headers,
    with_overrides,
)
from blobstore_server.services.s3.namespace import Condition, IfMatch, IfNoneMatch, Intent, ObjectRecord
from blobstore_server.services.s3.namespace.records import Manifest
from blobstore_server.services.s3.routing import Op
from blobstore_server.services.s3.transfer import read_object, write_object

Operation = Callable[[Backend, S3Request], Awaitable[S3Response]]


def write_condition(headers: dict[str, str]) -> Condition:
    """A conditional write: `If-None-Match: *` (only if absent) or `If-Match: etag` (only over that one)."""
    if "if-none-match" in headers:
        if headers["if-none-match"].strip() != "*":
            raise S3Error("NotImplemented", "a write's If-None-Match may only be *")
        return IfNoneMatch()
    if "if-match" in headers:
        return IfMatch(headers["if-match"].strip().strip('"'))
    return None


async def store_body(backend: Backend, request: S3Request, intent: Intent) -> tuple[Manifest, str, dict[str, str]]:
    """Stream the request's payload into the blob store, each Location recorded in `intent` as it is written,
    and check every digest the client sent: (manifest, MD5 hex, checksum headers to echo)."""
    limit = backend.config.max_object_size
    declared = request.declared_length()
    if declared is not None and declared > limit:
        raise S3Error("EntityTooLarge", f"{declared} bytes is over the limit of {limit} for one PUT")
    decoder, digests = request.decoder(), request.digests()

    async def bounded(body: Body) -> Body:
        taken = 0
        async for piece in body:
            taken += len(piece)
            if taken > limit:
                raise S3Error("EntityTooLarge", f"the body is over the limit of {limit} bytes for one PUT")
            yield piece

    manifest = await write_object(backend.sdk, bounded(request.payload(decoder)), backend.config.segment_size,
                                  backend.stored_into(intent), digests.update)
    size = sum(extent.size for extent in manifest)
    if declared is not None and size != declared:
        raise S3Error("IncompleteBody", f"the body has {size} bytes, {declared} were declared")
    result = digests.check(decoder.finish() if decoder is not None else None)
    return manifest, result.md5_hex, result.checksums


async def put_object(backend: Backend, request: S3Request) -> S3Response:
    bucket, key, store = request.route.bucket, request.route.key, backend.store
    if len(key) > 1024:
        raise S3Error("KeyTooLongError", f"a key has at most 1024 bytes, not {len(key)}", request.route.resource)
    condition = write_condition(request.headers)
    meta = meta_from_headers(request.headers)
    if isinstance(condition, IfNoneMatch) and await _exists(backend, bucket, key):
        raise S3Error("PreconditionFailed", "the key exists (If-None-Match: *)", request.route.resource)
    intent = store.begin_intent(request.owned_bucket, key)
    try:
        manifest, md5_hex, checksums = await store_body(backend, request, intent)
        record = ObjectRecord(key, sum(e.size for e in manifest), md5_hex, int(time.time() * 1000), meta, checksums,
                              None, manifest)
        await backend.db(store.commit_object, bucket, record, intent, condition)
    except BaseException:
        await asyncio.shield(backend.db(store.abandon_intent, intent))
        raise
    return S3Response(200, [("etag", f'"{md5_hex}"'), *checksums.items()])


async def _exists(backend: Backend, bucket: str, key: bytes) -> bool:
    try:
        await backend.db(backend.store.get_object, bucket, key)
    except S3Error as exc:
        if exc.code == "NoSuchKey":
            return False
        raise
    return True


def _wanted(request: S3Request, record: ObjectRecord) -> tuple[int, int] | None:
    """The bytes a GET or HEAD asks for (`Range`, or a part: 206), or None for the whole object (200)."""
    number = request.route.query.get("partNumber")
    if number is None:
        return byte_range(request.headers.get("range"), record.size)
    if "range" in request.headers:
        raise S3Error("InvalidRequest", "a Range and a partNumber cannot be asked together")
    return part_range(number, record)


async def get_object(backend: Backend, request: S3Request) -> S3Response:
    record = await backend.db(backend.store.get_object, request.route.bucket, request.route.key)
    try:
        check_read(request.headers, record.etag, record.last_modified_ms)
    except S3Error as exc:
        if exc.code != "NotModified":
            raise
        raise S3Error(exc.code, exc.message, request.route.resource, not_modified_headers(record)) from None
    wanted = _wanted(request, record)
    # the stored checksums are the whole object's: a range is sent without them (boto3 would check them against it)
    checksums = wanted is None and request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
    headers = with_overrides(object_headers(record, checksums), request.route.query)
    first, last = wanted if wanted is not None else (0, record.size - 1)
    if wanted is not None and last >= first:
        headers.append(("content-range", f"bytes {first}-{last}/{record.size}"))
    if "partNumber" in request.route.query and record.parts_count:
        headers.append(("x-amz-mp-parts-count", str(record.parts_count)))
    status, length = (206 if wanted is not None else 200), last - first + 1
    if request.route.op is Op.HEAD_OBJECT or length == 0:
        return S3Response(status, headers, b"", length)
    return S3Response(status, headers, read_object(backend.sdk, record.manifest, first, last), length)


async def delete_object(backend: Backend, request: S3Request) -> S3Response:
    await backend.db(backend.store.delete_object, request.route.bucket, request.route.key)
    return S3Response(204)


async def copy_object(backend: Backend, request: S3Request) -> S3Response:
    """CopyObject: the source's bytes stored again under the new key (its metadata kept, or with
    `x-amz-metadata-directive: REPLACE` the request's); a copy onto itself must change the metadata, and then
    keeps its Locations (nothing is copied)."""
    source = await copy_source(backend, request)
    bucket, key, store = request.route.bucket, request.route.key, backend.store
    directive = request.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error("InvalidArgument", f"x-amz-metadata-directive {directive!r} is neither COPY nor REPLACE")
    meta = meta_from_headers(request.headers) if directive == "REPLACE" else source.record.meta
    now = int(time.time() * 1000)
    if (source.bucket, source.record.key) == (bucket, key):
        if directive == "COPY":
            raise S3Error("InvalidRequest", "This copy request is illegal because it is trying to copy an object to "
                          "itself without changing the object's metadata, storage class, website redirect location "
                          "or encryption attributes.", request.route.resource)
        record = replace(source.record, last_modified_ms=now, meta=meta)
        await backend.db(store.commit_object, bucket, record, None, write_condition(request.headers))
    else:
        intent = store.begin_intent(request.owned_bucket, key)
        try:
            manifest, md5_hex = await copy_bytes(backend, source.record, 0, source.record.size - 1, intent)
            record = ObjectRecord(key, source.record.size, md5_hex, now, meta, copied_checksums(source.record), None,
                                  manifest)
            await backend.db(store.commit_object, bucket, record, intent, write_condition(request.headers))
        except BaseException:
            await asyncio.shield(backend.db(store.abandon_intent, intent))
            raise
    return S3Response.xml(replies.copy_object_result(record.etag, record.last_modified_ms))


async def delete_objects(backend: Backend, request: S3Request) -> S3Response:
    """DeleteObjects: up to 1000 keys in one transaction; S3 reports a key that held nothing as deleted too. S3
    requires Content-MD5 or a checksum of the body (every SDK sends one)."""
    if not request.digests().declared:
        raise S3Error("InvalidRequest", "Missing required header for this request: Content-MD5 or x-amz-checksum-*",
                      request.route.resource)
    keys, quiet = parse_delete(await request.read_all(MAX_BODY))
    await backend.db(backend.store.delete_objects, request.route.bucket, keys)
    return S3Response.xml(replies.delete_result(keys, [], quiet))


OPERATIONS: dict[Op, Operation] = {
    Op.COPY_OBJECT: copy_object,
    Op.DELETE_OBJECTS: delete_objects,
    Op.PUT_OBJECT: put_object,
    Op.GET_OBJECT: get_object,
    Op.HEAD_OBJECT: get_object,
    Op.DELETE_OBJECT: delete_object,
}
