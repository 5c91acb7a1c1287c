"""Which offsets may be committed when messages finish out of order (no I/O; the consumer loop feeds it)."""

from __future__ import annotations

from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class _Partition:
    pending: set[int] = field(default_factory=set)
    end: int = 0  # one past the highest offset seen
    committed: int | None = None

    def watermark(self) -> int:
        return min(self.pending) if self.pending else self.end


@dataclass
class OffsetTracker:
    """Kafka commits one position per partition: everything below it counts as done.

    So the position may only pass a message once it and every earlier one are done: it is the lowest
    offset still pending, or one past the highest seen. A message delivered again (after a rebalance
    or restart) is pending again, which can move the position back: harmless, as handlers are idempotent.
    """

    _parts: dict[TopicPartition, _Partition] = field(default_factory=dict)

    def add(self, tp: TopicPartition, offset: int) -> None:
        part = self._parts.setdefault(tp, _Partition())
        part.pending.add(offset)
        part.end = max(part.end, offset + 1)

    def done(self, tp: TopicPartition, offset: int) -> None:
        self._parts[tp].pending.discard(offset)

    def pending(self) -> int:
        return sum(len(p.pending) for p in self._parts.values())

    def committable(self) -> dict[TopicPartition, int]:
        """Positions that moved since the last `mark_committed`."""
        return {tp: p.watermark() for tp, p in self._parts.items() if p.watermark() != p.committed}

    def mark_committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self._parts[tp].committed = offset
