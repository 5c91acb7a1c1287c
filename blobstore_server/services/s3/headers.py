"""An object's HTTP headers both ways: what a PUT (or a multipart Create, or a CopyObject with REPLACE) stores,
and what a GET or HEAD answers with, the response-* query overrides applied last.

The standard headers are one table, read and written through the same rows, so what is stored is what comes back.
"""

from __future__ import annotations

from collections.abc import Mapping
from email.utils import formatdate

from blobstore_server.services.s3.checksums import PREFIX as CHECKSUM_PREFIX
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace.records import ObjectMeta, ObjectRecord

META_PREFIX = "x-amz-meta-"
MAX_USER_METADATA = 2048  # bytes of x-amz-meta-* names (prefix excluded) and values, UTF-8, as S3 counts them
DEFAULT_CONTENT_TYPE = "binary/octet-stream"

# header -> ObjectMeta field, for every standard header an object keeps (Content-Type apart: it has a default)
STANDARD: tuple[tuple[str, str], ...] = (
    ("Cache-Control", "cache_control"),
    ("Content-Disposition", "content_disposition"),
    ("Content-Encoding", "content_encoding"),
    ("Content-Language", "content_language"),
    ("Expires", "expires"),
)

# GetObject's query parameters that replace a header of the answer
OVERRIDES: dict[str, str] = {
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
    "response-content-language": "Content-Language",
    "response-content-type": "Content-Type",
    "response-expires": "Expires",
}


def http_date(ms: int) -> str:
    """An HTTP date (RFC 7231 IMF-fixdate, GMT) of a time in ms since the epoch: Last-Modified's format."""
    return formatdate(ms // 1000, usegmt=True)


def checksum_algorithm(name: str) -> str:
    """The algorithm of a stored checksum, whether it was stored as `crc32` or as `x-amz-checksum-crc32`."""
    return name.strip().lower().removeprefix(CHECKSUM_PREFIX)


def _content_encoding(value: str | None) -> str | None:
    """Content-Encoding without `aws-chunked`: that one describes the upload's framing, not the object."""
    if value is None:
        return None
    codings = [coding.strip() for coding in value.split(",")]
    kept = [coding for coding in codings if coding and coding.lower() != "aws-chunked"]
    return ", ".join(kept) or None


def _user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    metadata = {name[len(META_PREFIX):]: value.strip() for name, value in headers.items()
                if name.startswith(META_PREFIX) and len(name) > len(META_PREFIX)}
    size = sum(len(name.encode("utf-8", "surrogateescape")) + len(value.encode("utf-8", "surrogateescape"))
               for name, value in metadata.items())
    if size > MAX_USER_METADATA:
        raise S3Error("MetadataTooLarge", f"Your metadata headers exceed the maximum allowed metadata size: {size} "
                                         f"bytes of x-amz-meta-* names and values, at most {MAX_USER_METADATA}")
    return metadata


def meta_from_headers(headers: Mapping[str, str]) -> ObjectMeta:
    """What a PUT, a multipart Create or a CopyObject with REPLACE stores of its request headers (names matched
    case-insensitively; x-amz-meta-* names kept lower-case). An empty header is no header."""
    lowered = {name.lower(): value for name, value in headers.items()}
    standard = {field: lowered.get(name.lower(), "").strip() or None for name, field in STANDARD}
    return ObjectMeta(
        content_type=lowered.get("content-type", "").strip() or DEFAULT_CONTENT_TYPE,
        cache_control=standard["cache_control"],
        content_disposition=standard["content_disposition"],
        content_encoding=_content_encoding(standard["content_encoding"]),
        content_language=standard["content_language"],
        expires=standard["expires"],
        metadata=_user_metadata(lowered),
    )


def object_headers(record: ObjectRecord, checksum_mode: bool = False) -> list[tuple[str, str]]:
    """GET's and HEAD's headers of an object, but Content-Length and Content-Range (the range decides them).
    Stored checksums only when asked (`x-amz-checksum-mode: ENABLED`), as S3 does."""
    meta = record.meta
    headers = [("ETag", f'"{record.etag}"'), ("Last-Modified", http_date(record.last_modified_ms)),
               ("Accept-Ranges", "bytes"), ("Content-Type", meta.content_type)]
    headers += [(name, value) for name, field in STANDARD if (value := getattr(meta, field))]
    headers += [(META_PREFIX + name, value) for name, value in sorted(meta.metadata.items())]
    if checksum_mode and record.checksums:
        headers += sorted((CHECKSUM_PREFIX + checksum_algorithm(name), value)
                          for name, value in record.checksums.items())
        headers.append(("x-amz-checksum-type", "COMPOSITE" if record.parts_count else "FULL_OBJECT"))
    return headers


NOT_MODIFIED = frozenset({"etag", "last-modified", "cache-control", "expires"})


def not_modified_headers(record: ObjectRecord) -> list[tuple[str, str]]:
    """What a 304 answers of an object: the validators and caching headers a 200 would have sent (RFC 7232 4.1)."""
    return [(name, value) for name, value in object_headers(record) if name.lower() in NOT_MODIFIED]


def with_overrides(headers: list[tuple[str, str]], query: Mapping[str, str]) -> list[tuple[str, str]]:
    """`headers` with the response-* query parameters' values in place of the headers they name (GetObject)."""
    replaced = {OVERRIDES[param]: value for param, value in query.items() if param in OVERRIDES}
    gone = {name.lower() for name in replaced}
    kept = [(name, value) for name, value in headers if name.lower() not in gone]
    return kept + sorted(replaced.items())
