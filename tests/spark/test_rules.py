"""The blob verdicts of the inspection, row by row, in one Spark query over hand-made masks."""

from __future__ import annotations

from pyspark.sql import SparkSession

from blobstore_server.spark.rules import BlobState, blob_state

ALL = 0b111111  # EC3P3: six units, any three rebuild the blob
CUTOFF, PURGE_BEFORE = 1000.0, 500.0

CASES = [  # (what, normal_mask, deleted_mask, avail_mask, written_at, marked_at, expected)
    ("every shard present", ALL, 0, ALL, 900, 0, BlobState.HEALTHY),
    ("one shard gone", 0b111110, 0, ALL, 900, 0, BlobState.MISSING),
    ("three of six: still rebuildable", 0b000111, 0, ALL, 900, 0, BlobState.MISSING),
    ("two of six, every disk read", 0b000011, 0, ALL, 900, 0, BlobState.UNRECOVERABLE),
    ("two seen, two units unknown", 0b000011, 0, 0b001111, 900, 0, BlobState.UNVERIFIED),
    ("one seen, one unit unknown", 0b000001, 0, 0b011111, 900, 0, BlobState.UNRECOVERABLE),
    ("missing only on an unknown unit", 0b011111, 0, 0b011111, 900, 0, BlobState.HEALTHY),
    ("some marked deleted, some not", 0b000111, 0b111000, ALL, 900, 400, BlobState.PARTIAL_DELETE),
    ("marked everywhere long ago", 0, ALL, ALL, 100, 400, BlobState.NOT_PURGED),
    ("marked everywhere, within the safe delay", 0, ALL, ALL, 100, 600, BlobState.DELETING),
    ("marked on five, purged on one", 0, 0b011111, ALL, 100, 600, BlobState.DELETING),
    ("written after the cutoff", 0b000001, 0, ALL, 1001, 0, BlobState.RECENT),
    ("marked after the cutoff", 0b000111, 0b111000, ALL, 900, 1001, BlobState.RECENT),
]


def test_blob_states(spark: SparkSession) -> None:
    rows = [(what, normal, deleted, ALL, avail, 3, written, marked)
            for what, normal, deleted, avail, written, marked, _ in CASES]
    frame = spark.createDataFrame(rows, "what string, normal_mask long, deleted_mask long, unit_mask long, "
                                        "avail_mask long, n int, written_at long, marked_at long")
    got = {r["what"]: r["state"] for r in frame.select("what", blob_state(CUTOFF, PURGE_BEFORE).alias("state"))
           .collect()}
    assert got == {what: expected.value for what, *_, expected in CASES}
