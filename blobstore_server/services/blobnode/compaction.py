"""Automatic compaction's choice, free of I/O: which chunk of a disk to compact next, if any.

A chunk's garbage is the part of its used extent (from its header to its write offset) that no indexed shard owns:
shards deleted for good (their bytes punched out, but the range stays spent) and puts that failed half way. A
chunk takes writes only up to its size, so garbage is room lost; compaction copies the live shards into a new file
(services/blobnode/disk.py), whose writes go on right after them, and the old file goes to trash.

A chunk is worth compacting when its garbage is at least `min_garbage` bytes and at least `garbage_ratio` of its used
extent (the copy then moves at most (1 - ratio) / ratio bytes per byte regained). Only a writable (normal) chunk:
a read-only one is sealed for a move, which copies its live shards anyway. Only a quiet one: a compaction holds off
the chunk's writes, marks and deletes while it copies, so a chunk whose write offset, shard count or live bytes
changed within the last `idle` seconds waits (the rounds that look at it keep when it last changed; a restart starts
that count over). A chunk whose compaction failed (a shard that fails its CRC, which the scrub will have repaired)
waits `retry` seconds. Of those left, the one with the most garbage goes first, one per disk at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from blobstore_server.libs.chunkfile import CHUNK_HEADER_SIZE
from blobstore_server.libs.proto.blobnode import ChunkStat, ChunkStatus

RETRY = 3600.0  # seconds a chunk whose compaction failed waits before it is picked again


@dataclass(frozen=True)
class CompactRule:
    garbage_ratio: float  # of the chunk's used extent, 0 < ratio <= 1
    min_garbage: int  # bytes
    idle: float  # seconds without a write or delete
    retry: float = RETRY


def used_extent(stat: ChunkStat) -> int:
    return max(0, stat.write_offset - CHUNK_HEADER_SIZE)


def worth(rule: CompactRule, stat: ChunkStat) -> bool:
    """Whether the chunk's garbage is worth a compaction (busy or not)."""
    garbage = stat.punched_bytes
    return (stat.status is ChunkStatus.NORMAL and garbage > 0 and garbage >= rule.min_garbage
            and garbage >= rule.garbage_ratio * used_extent(stat))


def activity(stat: ChunkStat) -> tuple[int, int, int]:
    """What a write or a delete changes."""
    return stat.write_offset, stat.shard_count, stat.live_bytes


class CompactionPlan:
    """One disk's rounds: each looks at every chunk's stat and names the chunk to compact, if any."""

    def __init__(self, rule: CompactRule) -> None:
        self.rule = rule
        self._changed: dict[str, tuple[tuple[int, int, int], float]] = {}  # chunk id -> (activity, when it changed)
        self._failed: dict[str, float] = {}  # chunk id -> when it may be tried again

    def quiet_for(self, chunk_id: str, now: float) -> float:
        """Seconds since the chunk's last write or delete that a round saw (0 for one not seen yet)."""
        seen = self._changed.get(chunk_id)
        return 0.0 if seen is None else now - seen[1]

    def next(self, stats: Sequence[ChunkStat], now: float) -> ChunkStat | None:
        """The chunk to compact now, given every chunk's stat at `now`; None: none."""
        changed = {}
        for stat in stats:
            seen = self._changed.get(stat.chunk_id)
            changed[stat.chunk_id] = seen if seen is not None and seen[0] == activity(stat) else (activity(stat), now)
        self._changed = changed  # chunks gone (compacted, released) are forgotten
        self._failed = {chunk_id: until for chunk_id, until in self._failed.items() if chunk_id in changed}
        ready = [s for s in stats if worth(self.rule, s) and self.quiet_for(s.chunk_id, now) >= self.rule.idle
                 and self._failed.get(s.chunk_id, now) <= now]
        return max(ready, key=lambda s: (s.punched_bytes, s.chunk_id), default=None)

    def failed(self, chunk_id: str, now: float) -> None:
        self._failed[chunk_id] = now + self.rule.retry
