"""When a disk's failed system calls make it broken. A dying disk fails call after call; a healthy one meets a
bad sector now and then (a latent error: the scrubber or a read finds it, and the repair writes the shard anew
elsewhere in its chunk). So a disk is reported broken for `threshold` failures within `window` seconds, not for
that many over its whole life, which would one day condemn (and rebuild) every long-lived disk."""

from __future__ import annotations

import time
from collections import Counter, deque


class DiskFaults:
    """Failed system calls per disk: all of them counted (for /metrics), the recent ones timed."""

    def __init__(self, threshold: int, window: float) -> None:
        self.threshold, self.window = threshold, window
        self.totals: Counter[int] = Counter()
        self._recent: dict[int, deque[float]] = {}

    def record(self, disk_id: int, now: float | None = None) -> None:
        self.totals[disk_id] += 1
        recent = self._recent.setdefault(disk_id, deque(maxlen=self.threshold))
        recent.append(time.monotonic() if now is None else now)

    def failing(self, now: float | None = None) -> list[int]:
        """The disks with `threshold` failures within the last `window` seconds."""
        now = time.monotonic() if now is None else now
        return [disk_id for disk_id, recent in self._recent.items()
                if len(recent) == self.threshold and now - recent[0] <= self.window]
