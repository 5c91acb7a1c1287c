"""The SDK's exceptions and the one table that maps an access answer onto them.

Access renders every failure as `{"code": ..., "error": ...}` with a status from `libs/rpc/errors.py`;
the SDK keeps that code and message but raises a small, stable set of classes that callers catch.
"""

from __future__ import annotations

import json


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
    """The location was altered or forged: its signature does not match the cluster's secret."""


class NotFound(BlobstoreError):
    """The object or one of its parts does not exist."""


class RangeNotSatisfiable(BlobstoreError):
    """The byte range selects nothing of the object."""


class Unavailable(BlobstoreError):
    """No access host could serve the request now (connection failures, timeouts, 502/503/504)."""


_BY_STATUS: dict[int, type[BlobstoreError]] = {
    400: BadRequest,
    403: Forbidden,
    404: NotFound,
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
