"""S3's success bodies, as XML in the 2006-03-01 namespace, UTF-8, built from the namespace's records.

Keys are bytes and XML 1.0 carries text, and not every text: a listing asked with `encoding-type=url` writes keys,
prefixes, delimiters and markers percent-encoded (every byte but A-Z a-z 0-9 `-_.~/`, so a space is %20 and a `+`
is %2B: what botocore's unquote_plus and Go's PathUnescape both read back), and any key lists that way. Without it,
a listing that would have to write a key that is not UTF-8, or holds a character XML 1.0 cannot carry (C0 controls
but tab, LF and CR; U+FFFE, U+FFFF), fails with InvalidArgument naming encoding-type=url, instead of an
unparsable body or a key silently changed; a CR is written as `&#13;` so parsers keep it. Replies that echo the
key of the request (Initiate, Complete, ListParts, DeleteResult) write such characters as U+FFFD: the client
knows its key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.headers import checksum_algorithm
from blobstore_server.services.s3.namespace.listing import continuation_token, token_marker
from blobstore_server.services.s3.namespace.records import (
    Bucket,
    ListedObject,
    ObjectsPage,
    Part,
    PartsPage,
    Upload,
    UploadsPage,
)
from blobstore_server.services.s3.routing import Op

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
STORAGE_CLASS = "STANDARD"
MAX_KEYS = 1000  # the most a listing page holds, whatever max-keys asks
_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_COUNT = re.compile(r"\s*[0-9]+\s*")
_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})


# rendering ---------------------------------------------------------------------------------------------------------

def iso_time(ms: int) -> str:
    """ISO 8601 in UTC with milliseconds, as S3 writes times in XML: 2026-12-07T03:10:04.123Z."""
    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def _escape(text: str) -> str:
    """Text as element content (characters XML cannot carry become U+FFFD; listed keys are checked before)."""
    return _NOT_XML.sub("\ufffd", text).translate(_ESCAPES)


def _leaf(name: str, value: str | int | bool) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else _escape(str(value))
    return f"<{name}>{text}</{name}>"


def _node(name: str, *children: str) -> str:
    return f"<{name}>{''.join(children)}</{name}>"


def _document(root: str, *children: str) -> bytes:
    return f'{_DECLARATION}<{root} xmlns="{NAMESPACE}">{"".join(children)}</{root}>'.encode()


def _listed(key: bytes, url: bool) -> str:
    """A key, prefix, delimiter or marker as a listing writes it (see the module's docstring)."""
    if url:
        return quote(key, safe="/")
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or _NOT_XML.search(text):
        raise S3Error("InvalidArgument", f"The key {key!r} cannot be written in XML 1.0: list with "
                                         "encoding-type=url")
    return text


def _listed_leaf(name: str, key: bytes | None, url: bool) -> str:
    """An element holding a listed key, prefix or marker; none when `key` is None."""
    return "" if key is None else _leaf(name, _listed(key, url))


def _delimiter(params: ListParams) -> str:
    return _listed_leaf("Delimiter", params.delimiter or None, params.url)


def _echoed(key: bytes) -> str:
    return key.decode("utf-8", "replace")


def _owner(name: str, element: str = "Owner") -> str:
    return _node(element, _leaf("ID", name), _leaf("DisplayName", name))


def _etag(etag: str) -> str:
    return _leaf("ETag", f'"{etag}"')


def _prefixes(prefixes: Sequence[bytes], url: bool) -> str:
    return "".join(_node("CommonPrefixes", _leaf("Prefix", _listed(prefix, url))) for prefix in prefixes)


def _encoding(url: bool) -> str:
    return _leaf("EncodingType", "url") if url else ""


def _optional(name: str, value: str | int | None) -> str:
    return "" if value is None else _leaf(name, value)


# listing parameters ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ListParams:
    """A listing request's parameters as the client sent them: what the store is asked and the reply echoes.
    `marker` is ListObjects' marker, or ListObjectVersions' and ListMultipartUploads' key-marker."""

    prefix: bytes = b""
    delimiter: bytes = b""
    max_keys: int = MAX_KEYS  # max-keys, or max-uploads; capped at MAX_KEYS
    url: bool = False  # encoding-type=url
    marker: bytes | None = None
    start_after: bytes | None = None  # ListObjectsV2
    token: str | None = None  # ListObjectsV2's continuation-token, as sent
    fetch_owner: bool = False  # ListObjectsV2
    version_id_marker: str | None = None  # ListObjectVersions
    upload_id_marker: str | None = None  # ListMultipartUploads

    @classmethod
    def from_query(cls, op: Op, query: Mapping[str, str]) -> ListParams:
        """The parameters of a ListObjects, ListObjectsV2, ListObjectVersions or ListMultipartUploads query."""
        encoding = query.get("encoding-type")
        if encoding is not None and encoding != "url":
            raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request")
        limit = query.get("max-uploads" if op is Op.LIST_MULTIPART_UPLOADS else "max-keys", str(MAX_KEYS))
        if not _COUNT.fullmatch(limit):
            raise S3Error("InvalidArgument", f"Provided max-keys not an integer or within integer range: {limit!r}")

        def raw(name: str) -> bytes | None:
            value = query.get(name)
            return None if value is None else value.encode()

        v2 = op is Op.LIST_OBJECTS_V2
        return cls(prefix=raw("prefix") or b"", delimiter=raw("delimiter") or b"",
                   max_keys=min(int(limit), MAX_KEYS), url=encoding == "url",
                   marker=None if v2 else raw("marker" if op is Op.LIST_OBJECTS else "key-marker"),
                   start_after=raw("start-after") if v2 else None,
                   token=query.get("continuation-token") if v2 else None,
                   fetch_owner=v2 and query.get("fetch-owner", "").lower() == "true",
                   version_id_marker=query.get("version-id-marker"), upload_id_marker=query.get("upload-id-marker"))

    def after(self) -> bytes | None:
        """The key the store lists after: the continuation token's (it wins over start-after), else the marker. An
        empty token is none (S3 lists from the start, and echoes it)."""
        if self.token:
            marker = token_marker(self.token)
            if marker is None:
                raise S3Error("InvalidArgument", "The continuation token provided is incorrect")
            return marker
        return self.start_after if self.start_after is not None else self.marker


# buckets -----------------------------------------------------------------------------------------------------------

def list_buckets(buckets: Sequence[Bucket], owner: str) -> bytes:
    """ListAllMyBucketsResult: the buckets `owner` owns."""
    listed = "".join(_node("Bucket", _leaf("Name", b.name), _leaf("CreationDate", iso_time(b.created_ms)))
                     for b in buckets)
    return _document("ListAllMyBucketsResult", _owner(owner), _node("Buckets", listed))


def location_constraint(region: str = "") -> bytes:
    """GetBucketLocation: empty means us-east-1, as S3 answers for buckets there."""
    return _document("LocationConstraint", _escape(region))


def versioning_configuration() -> bytes:
    """GetBucketVersioning of a bucket versioning was never enabled on: no Status."""
    return _document("VersioningConfiguration")


# object listings ---------------------------------------------------------------------------------------------------

def _contents(obj: ListedObject, url: bool, owner: str | None) -> str:
    return _node("Contents", _leaf("Key", _listed(obj.key, url)), _leaf("LastModified", iso_time(obj.last_modified_ms)),
                 _etag(obj.etag), _leaf("Size", obj.size), _owner(owner) if owner is not None else "",
                 _leaf("StorageClass", STORAGE_CLASS))


def list_objects(bucket: str, params: ListParams, page: ObjectsPage, owner: str) -> bytes:
    """ListBucketResult of ListObjects (v1): NextMarker only on a truncated page with a delimiter, as S3 (without
    one, clients go on from the last key); every object names its owner."""
    url = params.url
    next_marker = page.next_marker if page.truncated and params.delimiter else None
    return _document(
        "ListBucketResult", _leaf("Name", bucket), _leaf("Prefix", _listed(params.prefix, url)),
        _leaf("Marker", _listed(params.marker or b"", url)),
        _listed_leaf("NextMarker", next_marker, url),
        _leaf("MaxKeys", params.max_keys), _delimiter(params),
        _leaf("IsTruncated", page.truncated), "".join(_contents(obj, url, owner) for obj in page.objects),
        _prefixes(page.prefixes, url), _encoding(url))


def list_objects_v2(bucket: str, params: ListParams, page: ObjectsPage, owner: str) -> bytes:
    """ListBucketResult of ListObjectsV2: KeyCount counts objects and common prefixes, Owner only with
    fetch-owner=true, NextContinuationToken only on a truncated page."""
    url = params.url
    token = continuation_token(page.next_marker) if page.truncated and page.next_marker is not None else None
    return _document(
        "ListBucketResult", _leaf("Name", bucket), _leaf("Prefix", _listed(params.prefix, url)),
        _leaf("KeyCount", len(page.objects) + len(page.prefixes)), _leaf("MaxKeys", params.max_keys),
        _delimiter(params),
        _leaf("IsTruncated", page.truncated), _optional("ContinuationToken", params.token),
        _optional("NextContinuationToken", token),
        _listed_leaf("StartAfter", params.start_after, url),
        "".join(_contents(obj, url, owner if params.fetch_owner else None) for obj in page.objects),
        _prefixes(page.prefixes, url), _encoding(url))


def _version(obj: ListedObject, url: bool, owner: str) -> str:
    return _node("Version", _leaf("Key", _listed(obj.key, url)), _leaf("VersionId", "null"), _leaf("IsLatest", True),
                 _leaf("LastModified", iso_time(obj.last_modified_ms)), _etag(obj.etag), _leaf("Size", obj.size),
                 _owner(owner), _leaf("StorageClass", STORAGE_CLASS))


def list_object_versions(bucket: str, params: ListParams, page: ObjectsPage, owner: str) -> bytes:
    """ListVersionsResult of an unversioned bucket: each object is its one version, "null" and latest. A truncated
    page gives NextKeyMarker, and NextVersionIdMarker when it ended on an object (not on a common prefix)."""
    url = params.url
    truncated = page.truncated and page.next_marker is not None
    ended_on_object = truncated and page.next_marker not in page.prefixes
    return _document(
        "ListVersionsResult", _leaf("Name", bucket), _leaf("Prefix", _listed(params.prefix, url)),
        _leaf("KeyMarker", _listed(params.marker or b"", url)),
        _leaf("VersionIdMarker", params.version_id_marker or ""),
        _listed_leaf("NextKeyMarker", page.next_marker if truncated else None, url),
        _leaf("NextVersionIdMarker", "null") if ended_on_object else "",
        _leaf("MaxKeys", params.max_keys), _delimiter(params),
        _leaf("IsTruncated", page.truncated), "".join(_version(obj, url, owner) for obj in page.objects),
        _prefixes(page.prefixes, url), _encoding(url))


# multipart ---------------------------------------------------------------------------------------------------------

def initiate_multipart_upload(bucket: str, key: bytes, upload_id: str) -> bytes:
    return _document("InitiateMultipartUploadResult", _leaf("Bucket", bucket), _leaf("Key", _echoed(key)),
                     _leaf("UploadId", upload_id))


def complete_multipart_upload(location: str, bucket: str, key: bytes, etag: str,
                              checksums: Mapping[str, str]) -> bytes:
    """CompleteMultipartUploadResult; `location` is the object's URL, `etag` bare (it is quoted here), `checksums`
    the object's composite one, if its parts had one."""
    return _document("CompleteMultipartUploadResult", _leaf("Location", location), _leaf("Bucket", bucket),
                     _leaf("Key", _echoed(key)), _etag(etag), _checksums(checksums),
                     _leaf("ChecksumType", "COMPOSITE") if checksums else "")


def _checksums(checksums: Mapping[str, str]) -> str:
    return "".join(_leaf("Checksum" + checksum_algorithm(name).upper(), value)
                   for name, value in sorted(checksums.items()))


def _part(part: Part) -> str:
    return _node("Part", _leaf("PartNumber", part.number), _leaf("LastModified", iso_time(part.last_modified_ms)),
                 _etag(part.etag), _leaf("Size", part.size), _checksums(part.checksums))


def list_parts(bucket: str, page: PartsPage, part_number_marker: int, max_parts: int) -> bytes:
    """ListPartsResult: the initiator and owner are the upload's owner."""
    upload = page.upload
    return _document(
        "ListPartsResult", _leaf("Bucket", bucket), _leaf("Key", _echoed(upload.key)), _leaf("UploadId", upload.id),
        _owner(upload.owner, "Initiator"), _owner(upload.owner), _leaf("StorageClass", STORAGE_CLASS),
        _leaf("PartNumberMarker", part_number_marker), _optional("NextPartNumberMarker", page.next_part_number_marker),
        _leaf("MaxParts", max_parts), _leaf("IsTruncated", page.truncated), "".join(map(_part, page.parts)))


def _upload(upload: Upload, url: bool) -> str:
    return _node("Upload", _leaf("Key", _listed(upload.key, url)), _leaf("UploadId", upload.id),
                 _owner(upload.owner, "Initiator"), _owner(upload.owner), _leaf("StorageClass", STORAGE_CLASS),
                 _leaf("Initiated", iso_time(upload.initiated_ms)))


def list_multipart_uploads(bucket: str, params: ListParams, page: UploadsPage) -> bytes:
    """ListMultipartUploadsResult; a truncated page gives NextKeyMarker, and NextUploadIdMarker when it ended on an
    upload."""
    url = params.url
    truncated = page.truncated and page.next_key_marker is not None
    return _document(
        "ListMultipartUploadsResult", _leaf("Bucket", bucket), _leaf("KeyMarker", _listed(params.marker or b"", url)),
        _leaf("UploadIdMarker", params.upload_id_marker or ""),
        _listed_leaf("NextKeyMarker", page.next_key_marker if truncated else None, url),
        _optional("NextUploadIdMarker", page.next_upload_id_marker if truncated else None),
        _delimiter(params),
        _leaf("Prefix", _listed(params.prefix, url)), _leaf("MaxUploads", params.max_keys),
        _leaf("IsTruncated", page.truncated), "".join(_upload(upload, url) for upload in page.uploads),
        _prefixes(page.prefixes, url), _encoding(url))


# copies and deletes ------------------------------------------------------------------------------------------------

def copy_object_result(etag: str, last_modified_ms: int) -> bytes:
    return _document("CopyObjectResult", _etag(etag), _leaf("LastModified", iso_time(last_modified_ms)))


def copy_part_result(etag: str, last_modified_ms: int) -> bytes:
    return _document("CopyPartResult", _etag(etag), _leaf("LastModified", iso_time(last_modified_ms)))


def delete_result(deleted: Sequence[bytes], errors: Sequence[tuple[bytes, S3Error]], quiet: bool) -> bytes:
    """DeleteResult of DeleteObjects: a Deleted entry per key (none when quiet; S3 counts a key that held no object
    as deleted), and an Error entry per key that failed."""
    done = "" if quiet else "".join(_node("Deleted", _leaf("Key", _echoed(key))) for key in deleted)
    failed = "".join(_node("Error", _leaf("Key", _echoed(key)), _leaf("Code", error.code),
                           _leaf("Message", error.message)) for key, error in errors)
    return _document("DeleteResult", done, failed)
