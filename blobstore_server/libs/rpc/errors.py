"""Typed errors shared by every service, and their one mapping to HTTP.

A service raises one of these; `libs.rpc.server` renders it as `{"code": ..., "error": ...}` with
the class's status, and `libs.rpc.client` turns such a body back into the same class.
"""

from __future__ import annotations

import math
from typing import ClassVar


class RpcError(Exception):
    """Base of every error that crosses a service boundary."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details = details  # machine-readable extras, e.g. the leader a follower points to

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "error": self.message, **self.details}

    def headers(self) -> dict[str, str]:
        """HTTP headers of the answer besides its body: `Retry-After` when the error says when to try again."""
        retry_after = self.details.get("retry_after")
        if isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
            return {"retry-after": str(max(1, math.ceil(retry_after)))}
        return {}


class BadRequest(RpcError):
    """The request is malformed or names something impossible."""

    code = "bad_request"
    status = 400


class LengthMismatch(BadRequest):
    """The body length differs from the declared size."""

    code = "length_mismatch"
    status = 400


class Unauthorized(RpcError):
    """The request is not signed, or its signature is wrong or too old."""

    code = "unauthorized"
    status = 401


class Forbidden(RpcError):
    """The caller may not do this (e.g. a forged Location)."""

    code = "forbidden"
    status = 403


class TicketRefused(Forbidden):
    """A chunk release without a valid release ticket (libs/rpc/tickets.py): missing, forged, expired, or made
    for another chunk."""

    code = "ticket_refused"
    status = 403


class NotFound(RpcError):
    """The named object does not exist."""

    code = "not_found"
    status = 404


class ShardNotFound(NotFound):
    """No such shard in the chunk."""

    code = "shard_not_found"
    status = 404


class ShardDeleted(NotFound):
    """The shard is mark-deleted; it reads as gone."""

    code = "shard_mark_deleted"
    status = 404


class Purged(NotFound):
    """The object's shards were removed for good (its delete's safe delay passed): an undelete cannot bring it back."""

    code = "purged"
    status = 404


class ChunkNotFound(NotFound):
    """No chunk for that vuid on the disk."""

    code = "chunk_not_found"
    status = 404


class DiskNotFound(NotFound):
    """No such disk on this node."""

    code = "disk_not_found"
    status = 404


class Conflict(RpcError):
    """The request conflicts with the current state."""

    code = "conflict"
    status = 409


class StaleEpoch(Conflict):
    """The vuid's epoch is older than the chunk's: the unit moved."""

    code = "stale_epoch"
    status = 409


class Fenced(Conflict):
    """Sent under a lease epoch that a newer holder has superseded (a fencing token): nothing was changed."""

    code = "fenced"
    status = 409


class ShardHeld(Conflict):
    """A delete for good sent before the blobnode's `delete_hold` since the mark passed; `details["retry_after"]`
    says when it will be taken."""

    code = "shard_held"
    status = 409


class ShardExists(Conflict):
    """The bid is stored with different bytes."""

    code = "shard_exists"
    status = 409


class ChunkReadonly(Conflict):
    """The chunk refuses writes (readonly or released)."""

    code = "chunk_readonly"
    status = 409


class ChunkExists(Conflict):
    """A chunk for that vuid already exists."""

    code = "chunk_exists"
    status = 409


class LengthRequired(RpcError):
    """The request must declare its body length."""

    code = "length_required"
    status = 411


class TooLarge(RpcError):
    """The body or object exceeds a limit."""

    code = "too_large"
    status = 413


class RequestTimeout(RpcError):
    """The client paused too long while sending its request."""

    code = "request_timeout"
    status = 408


class TooManyRequests(RpcError):
    """The client sent more requests than its rate allows; try again shortly."""

    code = "too_many_requests"
    status = 429


class HeadersTooLarge(RpcError):
    """The request's headers are larger than the service takes."""

    code = "headers_too_large"
    status = 431


class RangeNotSatisfiable(RpcError):
    """The byte range lies outside the object."""

    code = "range_not_satisfiable"
    status = 416


class Internal(RpcError):
    """An unexpected failure inside the service."""

    code = "internal"
    status = 500


class ShardCorrupted(RpcError):
    """Stored bytes failed their CRC; they are never served."""

    code = "shard_corrupted"
    status = 500


class Unavailable(RpcError):
    """The service or a dependency cannot serve right now; `details["retry_after"]` (seconds) says when it
    expects to again, sent as the `Retry-After` header."""

    code = "unavailable"
    status = 503


class Unreachable(Unavailable):
    """No answer at all: the connection failed or timed out. On the wire (a service passing it on) it is plain
    `unavailable`: the peer that answered is reachable."""

    code = "unavailable"
    status = 503


class WriteFenced(Unavailable):
    """A blobnode takes no shard write on that disk: clustermgr has not answered its heartbeats for its write fence,
    or marked the disk for repair (its units are being rebuilt elsewhere)."""

    code = "write_fenced"
    status = 503


class NotLeader(Unavailable):
    """This replica does not lead; `details["leader"]` names the one that does, if known."""

    code = "not_leader"
    status = 503


class NoSpace(RpcError):
    """The disk or chunk has no room left."""

    code = "no_space"
    status = 507


class ChunkFull(NoSpace):
    """The chunk has no room for the shard (the disk may have): its volume takes no more blobs."""

    code = "chunk_full"
    status = 507


def _subclasses(cls: type[RpcError]) -> list[type[RpcError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_subclasses(sub))
    return found


_BY_CODE: dict[str, type[RpcError]] = {cls.code: cls for cls in _subclasses(RpcError)}
_BY_CODE["internal"] = Internal
_BY_CODE["unavailable"] = Unavailable
_BY_STATUS: dict[int, type[RpcError]] = {
    cls.status: cls for cls in reversed(_subclasses(RpcError)) if cls.__base__ is RpcError
}


def error_from_response(status: int, body: object) -> RpcError:
    """Rebuild the typed error a peer raised from its status and JSON body."""
    code = body.get("code") if isinstance(body, dict) else None
    message = body.get("error") if isinstance(body, dict) else None
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _BY_STATUS.get(status, Internal)
    details = {k: v for k, v in body.items() if k not in ("code", "error")} if isinstance(body, dict) else {}
    return cls(str(message) if message else f"HTTP {status}", **details)
