"""Typed codec errors: callers map them to HTTP answers and repair decisions."""

from __future__ import annotations


class ECError(ValueError):
    """Base of every error raised by `libs.ec`."""


class UnknownCodeMode(ECError):
    """A code mode name or number that is not in the tactics table."""


class UnknownBackend(ECError):
    """A backend name this build cannot run."""


class BackendMismatch(ECError):
    """Parity written by one backend is being decoded by another (they are not interchangeable)."""


class NotEnoughShards(ECError):
    """Too many shards are missing for the code to recover the ones asked for."""

    def __init__(self, message: str, present: int, needed: int) -> None:
        super().__init__(message)
        self.present = present
        self.needed = needed


class ShardSizeMismatch(ECError):
    """Shards of one stripe differ in length, or do not match the blob size."""


class ShardCountMismatch(ECError):
    """A stripe was passed with a number of slots other than N+M+L."""


class BlobTooLarge(ECError):
    """A blob above `MAX_BLOB_SIZE`: callers must cut objects into blobs first."""
