"""Conditional requests and byte ranges, as S3 decides them: pure functions of the headers and the object.

Reads (GET, HEAD): If-Match and If-Unmodified-Since fail with 412, If-None-Match and If-Modified-Since with 304;
a true If-Match makes If-Unmodified-Since moot, a false If-None-Match (the ETag matched) decides 304 whatever
If-Modified-Since says (S3's documented precedence). A copy's source conditions (x-amz-copy-source-if-*) follow
the same rules but every failure is a 412.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from blobstore_server.services.s3.errors import S3Error


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
