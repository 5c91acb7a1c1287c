"""Cut an object into blobs and a byte range into the data-shard pieces that hold it.

GET reads only what it returns: a range maps to the blobs it touches, and within a blob to byte
ranges of the data shards (shard i holds blob bytes [i*S, (i+1)*S), S = tactic.shard_size); the
zero padding past the blob's end is never asked for. Parsing the HTTP `Range` header lives here
too, so every range decision of access is in one I/O-free module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence, Sized
from typing import NamedTuple, TypeVar, cast

from blobstore_server.libs.ec import Tactic
from blobstore_server.libs.rpc.errors import BadRequest, RangeNotSatisfiable


class BlobRange(NamedTuple):
    """Bytes [start, end) of blob `blob_index`."""

    blob_index: int
    start: int
    end: int


class ShardRead(NamedTuple):
    """`length` bytes at `offset` of data shard `shard_index`."""

    shard_index: int
    offset: int
    length: int


def split_object(size: int, blob_size: int) -> list[int]:
    """Length of each blob of a `size`-byte object: all `blob_size` but the last, which holds the rest."""
    if size < 0 or blob_size < 1:
        raise ValueError(f"cannot split {size} bytes into blobs of {blob_size}")
    full, rest = divmod(size, blob_size)
    return [blob_size] * full + ([rest] if rest else [])


def plan_range(size: int, blob_size: int, offset: int, length: int) -> list[BlobRange]:
    """The blob pieces that hold object bytes [offset, offset + length), in order."""
    if offset < 0 or length < 0:
        raise BadRequest(f"range offset {offset} and length {length} must not be negative")
    if offset + length > size:
        raise RangeNotSatisfiable(f"range [{offset}, {offset + length}) is outside the {size}-byte object")
    if blob_size < 1:
        raise ValueError(f"blob size {blob_size} must be positive")
    if length == 0:
        return []
    end = offset + length
    return [
        BlobRange(b, max(offset, b * blob_size) - b * blob_size, min(end, (b + 1) * blob_size) - b * blob_size)
        for b in range(offset // blob_size, -(-end // blob_size))
    ]


def shard_reads(tactic: Tactic, blob_len: int, start: int, end: int) -> list[ShardRead]:
    """The data-shard byte ranges holding bytes [start, end) of a `blob_len`-byte blob, in order."""
    if not 0 <= start <= end <= blob_len:
        raise ValueError(f"blob range [{start}, {end}) is outside the {blob_len}-byte blob")
    if start == end:
        return []
    s = tactic.shard_size(blob_len)
    return [
        ShardRead(i, max(start, i * s) - i * s, min(end, (i + 1) * s) - max(start, i * s))
        for i in range(start // s, -(-end // s))
    ]


def plan_runs(parts: Sequence[BlobRange], vids: Sequence[int], max_blobs: int) -> list[list[BlobRange]]:
    """`parts` cut into runs of consecutive ones in the same volume (`vids[i]` is part i's), at most `max_blobs`
    a run: each data shard's ranges of a run are read from its unit in one request."""
    if len(vids) != len(parts):
        raise ValueError(f"{len(vids)} volume ids for {len(parts)} parts")
    if max_blobs < 1:
        raise ValueError(f"a run holds at least one blob, not {max_blobs}")
    runs: list[list[BlobRange]] = []
    for i, part in enumerate(parts):
        if runs and vids[i] == vids[i - 1] and len(runs[-1]) < max_blobs:
            runs[-1].append(part)
        else:
            runs.append([part])
    return runs


Piece = bytes | bytearray | memoryview
P = TypeVar("P", bound=Sized)  # a piece in memory, or one still in a blobnode's answer (`splice.BodySpan`)
JOIN_BELOW = 1 << 20  # a smaller range goes out as one piece: one send beats a copy of so few bytes


def assemble(reads: Sequence[ShardRead], pieces: Sequence[P]) -> list[P | bytes]:
    """The pieces read for `reads`, in order, to send one after another: joined into one when the range is
    small and all are in memory, else as they are (joining megabytes was a fifth of access's CPU on large GETs).
    A piece of the wrong length is a bug upstream, never padded over."""
    if len(pieces) != len(reads):
        raise ValueError(f"{len(pieces)} pieces for {len(reads)} reads")
    for read, piece in zip(reads, pieces, strict=True):
        if len(piece) != read.length:
            raise ValueError(f"shard {read.shard_index} piece is {len(piece)} bytes, expected {read.length}")
    if len(pieces) > 1 and sum(read.length for read in reads) < JOIN_BELOW and all(
            isinstance(piece, bytes | bytearray | memoryview) for piece in pieces):
        return [b"".join(cast(Sequence[Piece], pieces))]
    return list(pieces)


_RANGE = re.compile(r"bytes=(?:([0-9]+)-([0-9]*)|-([0-9]+))", re.IGNORECASE)
_MAX_HEADER = 200  # far above any real single range; keeps int() off huge digit strings


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(offset, length) selected by a single-range `Range` header (RFC 9110 14.1.2); None means the whole object.

    Syntax errors, other units, several ranges and last < first are BadRequest (RFC 9110 would let us
    ignore the header; a clear 400 helps a client more than a surprise 200). A well-formed range that
    selects no byte of the object (first >= size, suffix 0, any range of an empty object) is a 416.
    Last positions past the end are clamped, and a suffix longer than the object selects all of it.
    """
    if header is None:
        return None
    if len(header) > _MAX_HEADER:
        raise BadRequest(f"Range header longer than {_MAX_HEADER} characters")
    if "," in header:
        raise BadRequest(f"Range {header!r}: only a single byte range is supported")
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        raise BadRequest(f"Range {header!r} is not bytes=first-last, bytes=first- or bytes=-suffix")
    first, last, suffix = match.groups()
    if suffix is not None:
        n = int(suffix)
        if n == 0 or size == 0:
            raise RangeNotSatisfiable(f"Range {header!r} selects no byte of the {size}-byte object")
        return max(0, size - n), min(n, size)
    a = int(first)
    b = int(last) if last else size - 1
    if last and b < a:
        raise BadRequest(f"Range {header!r}: last byte {b} is before first byte {a}")
    if a >= size:
        raise RangeNotSatisfiable(f"Range {header!r} starts at or past the end of the {size}-byte object")
    return a, min(b, size - 1) - a + 1
