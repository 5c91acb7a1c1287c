"""Conditional requests and byte ranges, as S3 decides them: pure functions of the headers and the object.

Reads (GET, HEAD): If-Match and If-Unmodified-Since fail with 412, If-None-Match and If-Modified-Since with 304;
a true If-Match makes If-Unmodified-Since moot, a false If-None-Match (the ETag matched) decides 304 whatever
If-Modified-Since says (S3's documented precedence). A copy's source conditions (x-amz-copy-source-if-*) follow
the same rules but every failure is a 412.

A GET or HEAD reads one range of bytes: a single `Range`, or with `?partNumber=N` the N-th part of a multipart
object (any other object is its own one part), never both.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace import ObjectRecord
from blobstore_server.services.s3.namespace.completion import MAX_PART_NUMBER


def _etags(value: str) -> list[str]:
    return [tag.strip().removeprefix("W/").strip('"') for tag in value.split(",") if tag.strip()]


def etag_matches(header: str, etag: str) -> bool:
    """Whether an If-Match / If-None-Match list names `etag` (quotes and weak markers ignored; * names any)."""
    tags = _etags(header)
    return "*" in tags or etag.strip('"') in tags


def _http_date(value: str | None) -> datetime | None:
    """An HTTP date, or None when absent or unreadable (an unreadable date is ignored, as HTTP says)."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def check_read(headers: Mapping[str, str], etag: str, last_modified_ms: int, prefix: str = "if-",
               not_modified: str = "NotModified") -> None:
    """Raise PreconditionFailed or `not_modified` when the conditions say the read does not happen. `headers`
    has lower-case names; a copy passes prefix "x-amz-copy-source-if-" and not_modified "PreconditionFailed"."""
    modified = datetime.fromtimestamp(last_modified_ms // 1000, UTC)  # HTTP dates have whole seconds
    if_match, if_none_match = headers.get(prefix + "match"), headers.get(prefix + "none-match")
    if if_match is not None:
        if not etag_matches(if_match, etag):
            raise S3Error("PreconditionFailed", f"the ETag is {etag}, not one of {if_match}")
    else:
        since = _http_date(headers.get(prefix + "unmodified-since"))
        if since is not None and modified > since:
            raise S3Error("PreconditionFailed", f"modified at {modified:%Y-%m-%d %H:%M:%S}, after {since}")
    if if_none_match is not None:
        if etag_matches(if_none_match, etag):
            raise S3Error(not_modified, f"the ETag is {etag}")
    else:
        since = _http_date(headers.get(prefix + "modified-since"))
        if since is not None and modified <= since:
            raise S3Error(not_modified, f"not modified since {since}")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The [first, last] byte positions a single `Range: bytes=...` asks of an object of `size` bytes, or None
    for the whole object (no header, or one S3 ignores: another unit, several ranges, unreadable).
    Unsatisfiable (starts past the end, also any range of an empty object): InvalidRange (416)."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first_text, dash, last_text = spec.strip().partition("-")
    first_text, last_text = first_text.strip(), last_text.strip()
    if not dash or not (first_text.isdigit() or first_text == "") or not (last_text.isdigit() or last_text == ""):
        return None
    if first_text == "":
        if last_text == "":
            return None
        suffix = int(last_text)
        if suffix == 0 or size == 0:
            raise S3Error("InvalidRange", f"the range {header} is not satisfiable for {size} bytes")
        return max(0, size - suffix), size - 1
    first = int(first_text)
    if last_text and int(last_text) < first:
        return None
    if first >= size:
        raise S3Error("InvalidRange", f"the range {header} is not satisfiable for {size} bytes")
    return first, size - 1 if last_text == "" else min(int(last_text), size - 1)


def part_range(number_text: str, record: ObjectRecord) -> tuple[int, int]:
    """The [first, last] byte positions of part `number_text` of `record` (`last = first - 1`: an empty part).
    Parts count from 1 in the completed object's order, as x-amz-mp-parts-count does; an object not uploaded in
    parts is its part 1."""
    if not number_text.isdigit() or not 1 <= int(number_text) <= MAX_PART_NUMBER:
        raise S3Error("InvalidArgument", f"partNumber is an integer from 1 to {MAX_PART_NUMBER}, not {number_text!r}")
    number = int(number_text)
    if number > (record.parts_count or 1):
        raise S3Error("InvalidPartNumber", f"the object has {record.parts_count or 1} parts, not {number}")
    if not record.parts_count:
        return 0, record.size - 1
    if record.manifest and not any(extent.part for extent in record.manifest):
        raise S3Error("NotImplemented", "the object was completed before its parts' bounds were kept")
    extents = [extent for extent in record.manifest if extent.part == number]
    if not extents:  # an empty part: only the last can be (every other is at least 5 MiB)
        return record.size, record.size - 1
    return extents[0].offset, extents[-1].offset + extents[-1].size - 1
