"""Volume space in the bytes a chunk file really spends: the one rule clustermgr (a volume's capacity), the
allocator (what it charges an allocation) and the tests share.

A blob puts one shard of `shard_size(len)` bytes (the code mode's stripe rule, at least 2 KiB) on every unit of
its volume, and a shard takes its header, block CRCs and footer, padded to 4 KiB (libs/chunkfile/format.py), so a
1 KiB object takes 4 KiB on each unit. A volume's capacity and `used` are counted per unit in these bytes: the
room its chunks have past their header; a volume is full once it has less room than the largest blob its
writers ask for takes (`is_full`). Counted in logical bytes (`chunk_size x N`), chunks of small objects
filled up at ~8% "used" and then failed every PUT sent to them.

An allocation of known blobs is charged exactly. A grant of `bids` bids sharing `size` bytes (access reserves
them for objects to come) is charged the most any use of it could take: its bytes spread over the data shards,
plus a shard's framing and a page of padding per bid. What comes back unused is refunded by the same bound
(rounded down where the charge rounds up), so what a grant keeps charged always covers what its objects took.
"""

from __future__ import annotations

from blobstore_server.libs.chunkfile.format import (
    ALIGN,
    BLOCK_CRC_SIZE,
    BLOCK_SIZE,
    CHUNK_HEADER_SIZE,
    SHARD_FOOTER_SIZE,
    SHARD_HEADER_SIZE,
    physical_size,
)
from blobstore_server.libs.ec import CodeMode, tactic

# The most one shard can take beyond its share of the data: header, footer, one more block CRC and a ceiling's
# byte than the data's own share, and a page of padding less one byte (4140 bytes).
_SHARD_OVERHEAD = SHARD_HEADER_SIZE + SHARD_FOOTER_SIZE + BLOCK_CRC_SIZE + 1 + ALIGN - 1


def is_full(mode: CodeMode, free: int, largest_blob: int) -> bool:
    """Whether a volume with `free` bytes left on each unit is full for a writer whose blobs are at most
    `largest_blob` long: it has less room than such a blob takes. The rest (less than one blob's shard a unit)
    stays unused: counted as room, a volume only small objects still fit was held, leased and counted writable on,
    and once every volume an allocator held was such a one, larger objects found none."""
    return free < blob_bytes(mode, largest_blob)


def unit_capacity(chunk_size: int) -> int:
    """The bytes a unit's chunk of `chunk_size` bytes holds shards in."""
    return chunk_size - CHUNK_HEADER_SIZE


def blob_bytes(mode: CodeMode, blob_len: int) -> int:
    """What one blob of `blob_len` bytes takes on each unit of its volume."""
    return physical_size(tactic(mode).shard_size(blob_len))


def charge(mode: CodeMode, size: int, blob_size: int, bids: int | None = None) -> int:
    """What an allocation takes on one unit: an object of `size` bytes cut into blobs of `blob_size`, exactly;
    with `bids` (more bids than its blobs), at most what `bids` objects sharing `size` bytes could take."""
    full, rest = divmod(size, blob_size)
    blobs = full + (rest > 0)
    if bids is None or bids <= blobs:
        return full * blob_bytes(mode, blob_size) + (blob_bytes(mode, rest) if rest else 0)
    numerator, denominator = _grant_bound(mode, size, bids)
    return -(-numerator // denominator)


def refund(mode: CodeMode, size: int, bids: int) -> int:
    """What comes back when `bids` bids and `size` bytes of a grant went unused (see the module docstring)."""
    numerator, denominator = _grant_bound(mode, size, bids)
    return numerator // denominator


def _grant_bound(mode: CodeMode, size: int, bids: int) -> tuple[int, int]:
    """The most `bids` blobs sharing `size` bytes take on one unit, as a fraction: each takes at most its share of
    the data (size_i / N) rounded up, one block CRC per 64 KiB of that share and one more, and `_SHARD_OVERHEAD`;
    a shard of the 2 KiB minimum takes one page, within the overhead."""
    n = tactic(mode).n
    # sum over blobs <= size/N + 4 * (size/N + bids) / BLOCK_SIZE + bids * _SHARD_OVERHEAD, times N * BLOCK_SIZE
    numerator = size * BLOCK_SIZE + BLOCK_CRC_SIZE * (size + n * bids) + _SHARD_OVERHEAD * bids * n * BLOCK_SIZE
    return numerator, n * BLOCK_SIZE
