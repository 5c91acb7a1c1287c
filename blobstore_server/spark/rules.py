"""What the inspection concludes about a blob, as Spark column expressions (no I/O; tests feed them rows).

A blob is judged from one row per (vid, bid) holding bit masks over its volume's unit indexes (a code mode
has at most 38 units, so a long holds them):

    unit_mask     every current unit of the volume
    avail_mask    units whose disk export could be read (the others are unknown, not empty)
    normal_mask   units holding the shard, not deleted
    deleted_mask  units holding the shard mark-deleted
    n             data shards of the code mode: any n shards rebuild the blob
    written_at    the newest write of any of its shards (unix s); marked_at: the newest mark-delete

The first matching rule wins, in the order of `blob_state`.
"""

from __future__ import annotations

from enum import StrEnum

from pyspark.sql import Column
from pyspark.sql import functions as F


class Finding(StrEnum):
    """Finding types: the partitions of the findings table and the count keys of summary.json."""

    MISSING_SHARDS = "missing_shards"  # a shard row per missing shard of a blob that can be rebuilt
    UNRECOVERABLE = "unrecoverable"  # a blob row: fewer than n shards exist even counting unknown units
    UNVERIFIED = "unverified"  # a blob row: fewer than n shards seen, but unavailable disks may hold more
    SIZE_MISMATCH = "size_mismatch"  # a shard row per shard whose size differs from its siblings'
    PARTIAL_DELETE = "partial_delete"  # a blob row: some shards mark-deleted, others not
    NOT_PURGED = "not_purged"  # a blob row: mark-deleted everywhere, still there past the safe delay
    ORPHAN_UNITS = "orphan_units"  # a chunk row: a chunk no volume unit (nor unit being moved in) names
    CORRUPT_SHARDS = "corrupt_shards"  # --deep, a shard row: its bytes fail their CRC
    PARITY_MISMATCH = "parity_mismatch"  # --deep, a blob row: every shard reads, but parity does not match data
    UNREAD_SHARDS = "unread_shards"  # --deep, a shard row: it could not be read (node down, moved), so unverified


class BlobState(StrEnum):
    RECENT = "recent"  # written or marked after the cutoff: a PUT or delete may still be under way; skipped
    DELETING = "deleting"  # mark-deleted everywhere within the safe delay: tinker will purge it
    HEALTHY = "healthy"
    MISSING = Finding.MISSING_SHARDS.value
    UNRECOVERABLE = Finding.UNRECOVERABLE.value
    UNVERIFIED = Finding.UNVERIFIED.value
    PARTIAL_DELETE = Finding.PARTIAL_DELETE.value
    NOT_PURGED = Finding.NOT_PURGED.value


# The findings table (one schema for every type; fields a type has no use for are null).
FINDING_DDL = ("finding string, vid long, bid long, unit_index int, disk_id long, host string, code_mode string, "
               "bytes long, detail string")
DEEP = frozenset({Finding.CORRUPT_SHARDS, Finding.PARITY_MISMATCH, Finding.UNREAD_SHARDS})  # only with --deep
# Findings the repair flag acts on: a repair message per blob, or a delete message.
REPAIRABLE = frozenset({Finding.MISSING_SHARDS, Finding.CORRUPT_SHARDS})
DELETABLE = frozenset({Finding.PARTIAL_DELETE})
# Blob states whose data is exposed (bytes at risk: n x shard size of each such blob).
AT_RISK = frozenset({BlobState.MISSING, BlobState.UNRECOVERABLE, BlobState.UNVERIFIED})


def unit_bit(index: Column) -> Column:
    # pyspark's own shiftleft takes a constant shift; the SQL function takes a column
    return F.call_function("shiftleft", F.lit(1).cast("long"), index)


def has_bit(mask: Column, index: Column) -> Column:
    return F.call_function("shiftright", mask, index).bitwiseAND(F.lit(1)) == 1


def missing_mask() -> Column:
    """Readable units that hold no shard of the blob at all (a mark-deleted shard is not missing)."""
    present = F.col("normal_mask").bitwiseOR(F.col("deleted_mask"))
    return F.col("avail_mask").bitwiseAND(F.bitwise_not(present))


def unknown_mask() -> Column:
    """Units on unavailable disks that show no shard (they may or may not hold one)."""
    present = F.col("normal_mask").bitwiseOR(F.col("deleted_mask"))
    return F.col("unit_mask").bitwiseAND(F.bitwise_not(F.col("avail_mask"))).bitwiseAND(F.bitwise_not(present))


def blob_state(cutoff: float, purge_before: float) -> Column:
    """The blob's state: bids written or marked after `cutoff` are in flight; a blob mark-deleted everywhere
    before `purge_before` (the export time less the safe delay) should have been purged."""
    normal = F.bit_count(F.col("normal_mask"))
    deleted = F.col("deleted_mask") != 0
    n = F.col("n")
    return (F.when((F.col("written_at") > cutoff) | (F.col("marked_at") > cutoff), BlobState.RECENT.value)
            .when(deleted & (F.col("normal_mask") != 0), BlobState.PARTIAL_DELETE.value)
            .when(deleted & (F.col("marked_at") < purge_before), BlobState.NOT_PURGED.value)
            .when(deleted, BlobState.DELETING.value)
            .when(normal + F.bit_count(unknown_mask()) < n, BlobState.UNRECOVERABLE.value)
            .when(normal < n, BlobState.UNVERIFIED.value)
            .when(missing_mask() != 0, BlobState.MISSING.value)
            .otherwise(BlobState.HEALTHY.value))
