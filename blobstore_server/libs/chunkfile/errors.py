"""Typed chunk-file errors; callers map them to RPC codes, so each failure has one class."""

from __future__ import annotations


class ChunkError(Exception):
    """Base of every chunk-file error."""


class ShardNotFound(ChunkError):
    """No index entry for this bid in this chunk."""


class ShardExists(ChunkError):
    """The bid is already stored with different bytes (identical bytes are idempotent)."""


class ShardCorrupted(ChunkError):
    """A CRC or framing check failed; the data is never returned."""


class ShardMarkDeleted(ChunkError):
    """The shard is mark-deleted: reads refuse it until it is unmarked."""


class ShardNotMarkDeleted(ChunkError):
    """A delete for good of a shard not marked deleted first (a blobnode takes it only in two steps)."""


class ShardHeld(ChunkError):
    """A delete for good of a shard marked deleted less than the blobnode's `delete_hold` ago."""

    def __init__(self, message: str, wait: float) -> None:
        super().__init__(message)
        self.wait = wait  # seconds until the delete is taken


class CrcMismatch(ChunkError):
    """The bytes of a put do not have the CRC its caller signed."""


class RangeError(ChunkError):
    """The requested offset/size lies outside the shard."""


class ChunkFull(ChunkError):
    """The write would grow the chunk past its max_size."""


class ChunkCorrupted(ChunkError):
    """The chunk header is unreadable (bad magic, version or CRC)."""


class ChunkReadOnly(ChunkError):
    """The chunk no longer takes writes (closed, or compacted into another chunk)."""


class PunchHoleError(ChunkError):
    """The filesystem refused to punch a hole (e.g. EOPNOTSUPP)."""
