"""Tinker's decisions, free of I/O: which offsets may be committed, when a failed message is
retried, and when a deleted blob may be removed for good."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OffsetTracker:
    """At-least-once bookkeeping for one partition: offsets are taken in order and finished in any
    order; the committable offset is one past the longest finished prefix, so a crash replays
    exactly the messages whose work was not done."""

    next_commit: int | None = None
    _open: set[int] = field(default_factory=set)
    _done: set[int] = field(default_factory=set)

    def take(self, offset: int) -> None:
        if self.next_commit is None:
            self.next_commit = offset
        if offset >= self.next_commit:
            self._open.add(offset)

    def finish(self, offset: int) -> None:
        if offset in self._open:
            self._open.discard(offset)
            self._done.add(offset)

    def committable(self) -> int | None:
        """The offset to commit (Kafka's 'next to read'), advanced past every finished prefix."""
        if self.next_commit is None:
            return None
        while self.next_commit in self._done:
            self._done.discard(self.next_commit)
            self.next_commit += 1
        return self.next_commit

    @property
    def in_flight(self) -> int:
        return len(self._open)


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 1.0
    cap: float = 300.0

    def backoff(self, retry: int) -> float:
        """Seconds to wait before attempt `retry` (1, 2, ...): doubling, capped; never give up."""
        return min(self.cap, self.base * 2 ** max(0, retry - 1))


def delete_due(message_time: float, safe_delay: float, now: float) -> float:
    """Seconds until a blob deleted at `message_time` may be removed for good (0: now)."""
    return max(0.0, message_time + safe_delay - now)
