"""The SDK's exceptions and the one table that maps an access answer onto them.

Access renders every failure as `{"code": ..., "error": ...}` with a status from `libs/rpc/errors.py`;
the SDK keeps that code and message but raises a small, stable set of classes that callers catch.
"""

from __future__ import annotations

import json

from blobstore.records import Upload


class BlobstoreError(Exception):
    """Base of every error the SDK raises; `code` is the service's machine-readable code."""

    def __init__(self, message: str, *, code: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


class BadRequest(BlobstoreError):
    """The request was refused as malformed (bad length, unknown code mode, object too large, ...)."""


class Forbidden(BlobstoreError):
    """The location was altered or forged (its signature does not match the cluster's secret), or the request needs
    a grant the client does not hold (an undelete)."""


class Conflict(BlobstoreError):
    """The request conflicts with what is stored (e.g. a part uploaded before with other bytes)."""


class NotFound(BlobstoreError):
    """The object or one of its parts does not exist."""


class RangeNotSatisfiable(BlobstoreError):
    """The byte range selects nothing of the object."""


class Unavailable(BlobstoreError):
    """No access host could serve the request now (connection failures, timeouts, 502/503/504)."""


class UploadIncomplete(Unavailable):
    """Some parts of a multipart upload were not written; `upload` holds what was, so passing it back
    to `put(..., upload=)` sends only the missing parts."""

    def __init__(self, upload: Upload, failures: dict[int, str]) -> None:
        shown = "; ".join(f"part {i}: {why}" for i, why in sorted(failures.items())[:3])
        super().__init__(f"{len(upload.missing)} of {len(upload.tokens)} parts not written ({shown})",
                         code="upload_incomplete")
        self.upload = upload
        self.failures = failures


_BY_STATUS: dict[int, type[BlobstoreError]] = {
    400: BadRequest,
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    411: BadRequest,
    413: BadRequest,
    416: RangeNotSatisfiable,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}
RETRYABLE_STATUS = frozenset(status for status, cls in _BY_STATUS.items() if cls is Unavailable)


def error_from_answer(status: int, body: bytes, what: str) -> BlobstoreError:
    """The exception for a non-2xx answer to `what` (e.g. "GET /blob/..."), keeping the service's reason."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    code, reason = "", body[:200].decode("utf-8", "replace")
    if isinstance(parsed, dict):
        code, reason = str(parsed.get("code", "")), str(parsed.get("error", reason))
    cls = _BY_STATUS.get(status, BlobstoreError)
    return cls(f"{what}: {status} {code or 'error'}: {reason}", code=code, status=status)
