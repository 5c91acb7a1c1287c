"""Where each blob of one object goes while allocations and retries unfold; pure, the clock is an argument.

A blob whose write misses the put quorum is retried on a fresh allocation for the rest of the object
(that blob and every one after it), in another volume. So the blobs written so far keep their place,
each retry adds at most one run of consecutive bids, and the Location lists the runs in object order.
A retry is refused (the PUT fails) when the blob has had `tries` tries, when its first try began
`retry_window` seconds ago, or when one more run would give the Location more than `max_slices`
slices: the runs written cannot move (the body is streamed, not kept), so the object fails rather than
produce a Location nobody could read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from blobstore_server.libs.proto.allocator import BlobSlice
from blobstore_server.libs.proto.location import MAX_SLICES, SliceInfo


class RetryRefused(Exception):
    """The failed blob may not be retried; the message says which budget ran out."""


@dataclass
class PutPlan:
    blob_count: int
    tries: int
    retry_window: float
    max_slices: int = MAX_SLICES
    _placed: list[tuple[int, int]] = field(default_factory=list)  # (vid, bid) of each blob written, in order
    _ahead: list[tuple[int, int]] = field(default_factory=list)  # allocated for the blobs still to write
    _tries: int = 0  # tries of the next blob so far
    _first_try: float = 0.0

    def allocated(self, slices: Sequence[BlobSlice]) -> None:
        """Take an allocation for every blob not yet written."""
        ahead = [(s.vid, bid) for s in slices for bid in range(s.min_bid, s.min_bid + s.count)]
        if len(ahead) != self.blob_count - len(self._placed):
            raise ValueError(f"allocation holds {len(ahead)} blobs; {self.blob_count - len(self._placed)} are left")
        self._ahead = ahead

    def begin(self, now: float) -> tuple[int, int]:
        """(vid, bid) for the next blob's try."""
        if self._tries == 0:
            self._first_try = now
        self._tries += 1
        return self._ahead[0]

    def written(self) -> None:
        self._placed.append(self._ahead.pop(0))
        self._tries = 0

    def failed(self, now: float) -> None:
        """The try missed its quorum: raises `RetryRefused`, or else expects `allocated` for the rest."""
        if self._tries >= self.tries:
            raise RetryRefused(f"blob {len(self._placed)} of the object failed {self._tries} tries")
        if now - self._first_try >= self.retry_window:
            raise RetryRefused(f"blob {len(self._placed)} of the object failed for {now - self._first_try:.1f} s")
        if len(_runs(self._placed)) + 1 > self.max_slices:
            raise RetryRefused(f"a retry would split the object into more than {self.max_slices} slices")
        self._ahead = []

    def slices(self) -> tuple[SliceInfo, ...]:
        """The Location's slices once every blob is written."""
        if len(self._placed) != self.blob_count:
            raise ValueError(f"{len(self._placed)} of {self.blob_count} blobs written")
        return tuple(SliceInfo(min_bid=bid, vid=vid, count=count) for vid, bid, count in _runs(self._placed))


def _runs(placed: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Consecutive bids of one volume folded into (vid, first bid, count)."""
    runs: list[tuple[int, int, int]] = []
    for vid, bid in placed:
        if runs and runs[-1][0] == vid and runs[-1][1] + runs[-1][2] == bid:
            runs[-1] = (vid, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((vid, bid, 1))
    return runs
