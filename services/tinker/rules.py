"""Tinker's decisions, free of I/O: when a failed message is retried, and when a deleted blob may
be removed for good. (Which offsets may be committed is `libs.mq.offsets.OffsetTracker`.)"""

from __future__ import annotations

from dataclasses import dataclass


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
