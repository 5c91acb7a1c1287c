"""When a small read asks other shards too: the recent tail of small reads' latencies; pure, no clock.

A GET of a small object waits for all N of its data shards, so its latency is the slowest of N shard reads:
one blobnode descheduled for a few ms (a busy core, a rebuild writing to it) is the whole GET's tail. Asking
other shards for the bytes of those still out once the wait passes the recent `quantile` of the time reads
took until all N data shards answered, and decoding from whichever N answer first, cuts that tail for a few
percent more shard reads: by construction only 1 - `quantile` of the reads hedge, whatever N ("The Tail at
Scale", Dean and Barroso, 2013: requests hedged at the 95th percentile).
"""

from __future__ import annotations

import math
from collections import deque


class TailDelay:
    """The `quantile` of the last `window` observed latencies, but at most `median_multiple` times their median
    and at least `floor` seconds; None until `window // 4` have been seen (no hedging on a guess). Recomputed
    every `window // 8` observations. The cap keeps the estimate from chasing a tail that is itself the trouble:
    a node stalled 30 ms in every 300 holds up more than 5% of the reads, which then raise the 95th percentile to
    the stall itself."""

    def __init__(self, quantile: float, floor: float, window: int = 256, median_multiple: float = 3.0) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile {quantile} is not within (0, 1)")
        if window < 8:
            raise ValueError(f"a window of {window} latencies is too short to have a tail")
        self.quantile = quantile
        self.floor = floor
        self.median_multiple = median_multiple
        self._seen: deque[float] = deque(maxlen=window)
        self._enough = window // 4
        self._every = window // 8
        self._since = 0
        self._delay: float | None = None

    def observe(self, seconds: float) -> None:
        self._seen.append(seconds)
        self._since += 1
        if self._since >= self._every and len(self._seen) >= self._enough:
            self._since = 0
            ordered = sorted(self._seen)
            tail = ordered[min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)]
            self._delay = max(self.floor, min(tail, self.median_multiple * ordered[len(ordered) // 2]))

    def delay(self) -> float | None:
        return self._delay
