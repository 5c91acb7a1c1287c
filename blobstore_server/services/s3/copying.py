"""The source of a CopyObject or UploadPartCopy: `x-amz-copy-source` parsed, owned by the caller, its
conditions met, and its bytes (all, or `x-amz-copy-source-range`) written again as new Locations (no Location
is shared between two objects, so deleting one never takes the other's bytes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.conditions import check_read
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.exchange import S3Request
from blobstore_server.services.s3.namespace import Intent, ObjectRecord
from blobstore_server.services.s3.namespace.records import Manifest
from blobstore_server.services.s3.transfer import read_object, write_object

COPY_CONDITIONS = "x-amz-copy-source-if-"


@dataclass(frozen=True)
class Source:
    bucket: str
    record: ObjectRecord


def parse_copy_source(header: str) -> tuple[str, bytes]:
    """`/bucket/key` or `bucket/key`, percent-encoded, with an optional `?versionId=null`."""
    path, _, query = header.partition("?")
    if query and query not in ("versionId=null",):
        raise S3Error("NotImplemented", "copying a version other than null is not supported")
    bucket, _, key = path.lstrip("/").partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", f"x-amz-copy-source {header!r} names no bucket and key")
    return unquote_to_bytes(bucket).decode("utf-8", "replace"), unquote_to_bytes(key)


async def copy_source(backend: Backend, request: S3Request) -> Source:
    bucket, key = parse_copy_source(request.headers["x-amz-copy-source"])
    found = await backend.db(backend.store.get_bucket, bucket)
    if found.owner != request.user.name:
        raise S3Error("AccessDenied", f"bucket {bucket} is not yours", f"/{bucket}")
    record = await backend.db(backend.store.get_object, bucket, key)
    check_read(request.headers, record.etag, record.last_modified_ms, COPY_CONDITIONS, "PreconditionFailed")
    return Source(bucket, record)


def copied_checksums(record: ObjectRecord) -> dict[str, str]:
    """The checksums a copy of `record` under another key carries: a whole object's are its bytes', so the copy's
    too; a multipart object's are COMPOSITE, of its parts, and the copy is one part: it gets none (S3 answering
    none is safe, a wrong one fails every client that checks it)."""
    return {} if record.parts_count else dict(record.checksums)


def source_range(header: str | None, size: int) -> tuple[int, int]:
    """[first, last] of `x-amz-copy-source-range: bytes=first-last` (both required, inside the object), else the
    whole object."""
    if header is None:
        return 0, size - 1
    unit, _, spec = header.strip().partition("=")
    first_text, _, last_text = spec.partition("-")
    if unit != "bytes" or not first_text.isdigit() or not last_text.isdigit():
        raise S3Error("InvalidArgument", f"x-amz-copy-source-range {header!r} is not bytes=first-last")
    first, last = int(first_text), int(last_text)
    if last < first or last >= size:
        raise S3Error("InvalidRange", f"the range {header} is outside the source's {size} bytes")
    return first, last


async def copy_bytes(backend: Backend, record: ObjectRecord, first: int, last: int, intent: Intent
                     ) -> tuple[Manifest, str]:
    """Bytes [first, last] of `record` stored again as new Locations recorded in `intent`: (manifest, MD5 hex)."""
    md5 = hashlib.md5()
    if last < first:  # an empty source
        return (), md5.hexdigest()
    manifest = await write_object(backend.sdk, read_object(backend.sdk, record.manifest, first, last),
                                  backend.config.segment_size, backend.stored_into(intent), md5.update)
    return manifest, md5.hexdigest()
