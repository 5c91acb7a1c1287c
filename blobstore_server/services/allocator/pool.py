"""The allocator's bookkeeping, free of I/O: leased volumes per code mode and a prefetched bid range.

A volume is allocated from only while its lease has at least `lease_margin` seconds left, so an
allocation handed out can never outlive the lease it was made under; space handed out is
recorded at once, so two requests never get the same bytes of a volume. Every time here is on the allocator's
monotonic clock: a lease ends `lease_for` seconds (clustermgr's answer) after the allocator asked for it, and an
allocation is usable for a duration, so neither clustermgr's wall clock nor access's is ever compared with ours.

An allocation is charged what its shards take on one unit's chunk (libs/space.py), and a volume's capacity is
counted in the same bytes. A volume access found full (a blobnode answered ChunkFull) leaves the pool at once.

Which volume: never one access excluded (it just failed a write there); then the one whose units a
writer should expect to miss the fewest of (down per clustermgr, or on a disk access avoids), then one
with a unit on every host before an under-spread one (created while hosts were down: once they are
back, writes return to the well-spread volumes), then the one with the most room. A volume expected to
miss more units than the code's put slack is not used.
How many: `target` writable volumes per mode, and more, up to twice the target, while some single host holds
more than the put slack of every leased volume's units (its loss would leave no volume that reaches its quorum).
Twice, not without end: clustermgr keeps unleased volumes in stock, and on too few hosts no volume survives
every host's loss.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.proto.allocator import BlobSlice, LeasedVolume
from blobstore_server.libs.proto.cluster import VolumeHealth


class PoolEmpty(Exception):
    """No leased volume of the mode has room (`no_volume`), or no bids are left: refill and retry."""

    def __init__(self, message: str, *, no_volume: bool = False) -> None:
        super().__init__(message)
        self.no_volume = no_volume


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

    def usable(self, code_mode: CodeMode, now: float) -> list[LeasedVolume]:
        return [v for v in self.volumes.values()
                if v.code_mode == code_mode and v.free > 0 and v.lease_until - self.lease_margin > now]

    def add(self, volume: LeasedVolume) -> None:
        self.volumes[volume.vid] = volume

    def drop(self, vid: int) -> None:
        self.volumes.pop(vid, None)

    def renewed(self, vid: int, lease_until: float, health: VolumeHealth) -> None:
        volume = self.volumes.get(vid)
        if volume is not None:
            volume.lease_until = lease_until
            volume.writable, volume.why_not, volume.down_units = health.writable, health.why_not, health.down_units

    def choices(self, code_mode: CodeMode, charge: int, now: float, exclude_vids: Collection[int] = (),
                avoid_disks: Collection[int] = ()) -> list[LeasedVolume]:
        """The volumes that may take an allocation charged `charge` bytes, best first (see the module docstring)."""
        slack = tactic(code_mode).put_slack
        ranked = []
        for volume in self.usable(code_mode, now):
            if volume.free < charge or volume.vid in exclude_vids:
                continue
            missing = set(volume.down_units) | {i for i, d in enumerate(volume.disks) if d in avoid_disks}
            if len(missing) <= slack:
                ranked.append((len(missing), volume.under_spread, -volume.free, volume.vid, volume))
        return [r[-1] for r in sorted(ranked, key=lambda r: r[:4])]

    def wanted(self, code_mode: CodeMode, now: float, target: int) -> int:
        """How many more volumes of the mode to lease (see the module docstring)."""
        good = [v for v in self.usable(code_mode, now) if v.writable]
        if len(good) < target:
            return target - len(good)
        if len(good) >= 2 * target:
            return 0
        slack = tactic(code_mode).put_slack
        hosts = {h for v in good for h in v.hosts}
        survives = all(any(v.hosts.count(h) <= slack for v in good) for h in hosts)
        return 0 if survives else 1

    def give_back(self, vid: int, size: int, bids: int) -> None:
        """`bids` bids and `size` bytes of a grant that went unused (a volume no longer leased here is not ours
        to fix)."""
        volume = self.volumes.get(vid)
        if volume is not None:
            volume.used = max(0, volume.used - space.refund(volume.code_mode, size, bids))

    def allocate(self, code_mode: CodeMode, size: int, blob_size: int, now: float, exclude_vids: Collection[int] = (),
                 avoid_disks: Collection[int] = (), bids: int | None = None) -> list[BlobSlice]:
        """Space for an object of `size` bytes cut into blobs of `blob_size` (or `size` bytes for the
        objects of a reservation of `bids` bids): one volume, one bid run. Bids are taken only once a
        volume has room, so a refusal consumes nothing."""
        count = max(1, -(-size // blob_size), bids or 0)
        charge = space.charge(code_mode, size, blob_size, bids)
        options = self.choices(code_mode, charge, now, exclude_vids, avoid_disks)
        if not options:
            raise PoolEmpty(f"no leased volume of code mode {code_mode} that access may use has {charge} bytes free"
                            f" for {size} bytes", no_volume=True)
        volume = options[0]
        first = self.bids.take(count)
        volume.used += charge
        return [BlobSlice(vid=volume.vid, min_bid=first, count=count,
                          usable_for=volume.lease_until - self.lease_margin - now)]
