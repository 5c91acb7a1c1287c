"""The blobnode's instruments updated as things happen: shard operations, checksum failures, fdatasync
latency, the upkeep's trash purges and compactions. What is read at scrape time is figures.py."""

from __future__ import annotations

import functools
from typing import Any

from prometheus_client import Counter, Histogram

SHARD_OPS = Counter("blobstore_blobnode_shard_ops", "Shard operations by disk, operation and result",
                    ["disk_id", "op", "result"])
CRC_FAILURES = Counter("blobstore_blobnode_crc_failures", "Shard or chunk reads that failed their CRC check",
                       ["disk_id"])
FSYNC_SECONDS = Histogram("blobstore_blobnode_fsync_seconds", "fdatasync of shard bytes (one covers a group "
                          "of concurrent writes)", ["disk_id"],
                          buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0))

WRITE_FENCE_REFUSALS = Counter("blobstore_blobnode_write_fence_refusals", "Shard writes refused by the write "
                               "fence: no heartbeat answered within it, or the disk marked for repair", ["disk_id"])
TRASH_PURGED = Counter("blobstore_blobnode_trash_purged_bytes", "Bytes on disk of chunk files removed from the "
                       "disk's .trash/ once their trash_hold was over", ["disk_id"])
COMPACTIONS = Counter("blobstore_blobnode_compactions", "Chunks the blobnode compacted by its own rule "
                      "(compact_garbage_ratio, compact_min_garbage, compact_idle), by result", ["disk_id", "result"])
COMPACTED_GARBAGE = Counter("blobstore_blobnode_compacted_garbage_bytes", "Garbage (used extent no shard owned) "
                            "given back to chunks by the blobnode's own compactions", ["disk_id"])


@functools.cache
def shard_op(disk_id: int, op: str, ok: bool) -> Any:
    """The counter of one (disk, operation, result); cached, since it is looked up per shard call."""
    return SHARD_OPS.labels(str(disk_id), op, "ok" if ok else "error")
