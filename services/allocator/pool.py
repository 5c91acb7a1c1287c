"""The allocator's bookkeeping, free of I/O: leased volumes per code mode and a prefetched bid range.

A volume is allocated from only while its lease has at least `lease_margin` seconds left, so an
allocation handed out can never outlive the lease it was made under; space handed out is
recorded at once, so two requests never get the same bytes of a volume.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from libs.proto.allocator import BlobSlice, LeasedVolume


class PoolEmpty(Exception):
    """No leased volume of the mode has room, or no bids are left: refill and retry."""


@dataclass
class BidRanges:
    """Disjoint bid ranges fetched from the clustermgr scope, oldest first (ends inclusive)."""

    ranges: deque[list[int]] = field(default_factory=deque)

    @property
    def left(self) -> int:
        return sum(end - start + 1 for start, end in self.ranges)

    def add(self, start: int, end: int) -> None:
        self.ranges.append([start, end])

    def take(self, count: int) -> int:
        """`count` consecutive bids (a Location slice is min_bid + count); a range too short for
        them is skipped, wasting a few ids rather than splitting an object."""
        while self.ranges:
            start, end = self.ranges[0]
            if end - start + 1 >= count:
                self.ranges[0][0] = start + count
                if start + count > end:
                    self.ranges.popleft()
                return start
            self.ranges.popleft()
        raise PoolEmpty(f"no run of {count} bids left")


@dataclass
class VolumePool:
    lease_margin: float
    volumes: dict[int, LeasedVolume] = field(default_factory=dict)
    bids: BidRanges = field(default_factory=BidRanges)

    def usable(self, code_mode: int, now: float) -> list[LeasedVolume]:
        return [v for v in self.volumes.values()
                if v.code_mode == code_mode and v.free > 0 and v.lease_expiry - self.lease_margin > now]

    def add(self, volume: LeasedVolume) -> None:
        self.volumes[volume.vid] = volume

    def drop(self, vid: int) -> None:
        self.volumes.pop(vid, None)

    def renewed(self, vid: int, lease_expiry: float) -> None:
        if vid in self.volumes:
            self.volumes[vid].lease_expiry = lease_expiry

    def allocate(self, code_mode: int, size: int, blob_size: int, now: float) -> list[BlobSlice]:
        """Space for an object of `size` bytes cut into blobs of `blob_size`: one volume, one bid
        run. Bids are taken only once a volume has room, so a refusal consumes nothing."""
        count = max(1, -(-size // blob_size))
        candidates = [v for v in self.usable(code_mode, now) if v.free >= size]
        if not candidates:
            raise PoolEmpty(f"no leased volume of code mode {code_mode} has {size} bytes free")
        volume = max(candidates, key=lambda v: v.free)
        first = self.bids.take(count)
        volume.used += size
        return [BlobSlice(vid=volume.vid, min_bid=first, count=count)]
