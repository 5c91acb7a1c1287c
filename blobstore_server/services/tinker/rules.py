"""Tinker's decisions, free of I/O: when a failed message is retried, when a deleted blob may be
removed for good, whether an undelete took a delete back, and whether a multipart upload was finished.
(Which offsets may be committed is `libs.mq.offsets.OffsetTracker`.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from blobstore_server.libs.proto.blobnode import MARK_GRANULARITY, ShardState
from blobstore_server.libs.proto.clustermgr import UNDELETE_MARGIN


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 1.0
    cap: float = 300.0

    def backoff(self, retry: int) -> float:
        """Seconds to wait before attempt `retry` (1, 2, ...): doubling, capped; never give up."""
        return min(self.cap, self.base * 2 ** max(0, retry - 1))


def delete_due(marked_at: float, safe_delay: float, now: float) -> float:
    """Seconds until a blob whose shards were all marked deleted at `marked_at` may be removed for good (0: now):
    its blobnodes refuse it before their `delete_hold` (the same delay) has passed since the end of the whole
    second they keep as the mark's time."""
    return 0.0 if safe_delay <= 0 else max(0.0, marked_at + MARK_GRANULARITY + safe_delay - now)


def taken_back(deleted_at: float, undeleted_at: float | None, margin: float = UNDELETE_MARGIN) -> bool:
    """Whether the latest undelete of a blob (`undeleted_at`, clustermgr's clock; None: none kept) takes back its
    delete stamped `deleted_at` (mqproxy's clock): every delete issued before the undelete, and, as the two clocks
    may differ by `margin`, those stamped up to `margin` after it. A later delete stands."""
    return undeleted_at is not None and deleted_at <= undeleted_at + margin


class UploadVerdict(StrEnum):
    FINISHED = "finished"  # every blob was written: keep the object
    UNFINISHED = "unfinished"  # some blob cannot have been written: reclaim the upload
    UNKNOWN = "unknown"  # too many blobnodes silent to tell: ask again later


def upload_verdict(blobs: Sequence[Sequence[ShardState]], data_shards: int) -> UploadVerdict:
    """Whether a multipart upload was finished, from each blob's shard states: a blob counts as written
    when at least `data_shards` of its shards are present (it reads back)."""
    verdict = UploadVerdict.FINISHED
    for states in blobs:
        present = sum(s is ShardState.PRESENT for s in states)
        if present >= data_shards:
            continue
        silent = sum(s in (ShardState.UNREACHABLE, ShardState.ERROR, ShardState.MOVED) for s in states)
        if present + silent < data_shards:
            return UploadVerdict.UNFINISHED
        verdict = UploadVerdict.UNKNOWN
    return verdict
