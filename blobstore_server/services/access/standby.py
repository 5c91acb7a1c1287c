"""Space access holds to ride out an allocator outage; pure, the clock (monotonic) is an argument.

While allocators answer, every PUT is allocated by one, and this stock is not touched. A background loop
keeps, per code mode in use, two grants (runs of consecutive bids and the bytes that go with them, in two
volumes when the allocators have two) sized so that together they carry `ride_out` seconds of this node's
recent PUT rate `headroom` times over. A grant is written to only until the allocator's lease on its volume
ends, less the allocator's margin (`BlobSlice.usable_for`, counted from when it was asked for), so no blob lands
in a volume clustermgr may have given away; a grant that can no longer cover `ride_out` seconds is replaced while
the allocators answer, and its unused bytes go back to the allocator (`returned`). When no allocator answers, PUTs
take from the stock, the grant nearest its end first, skipping (not dropping) grants whose volume a write just
failed in.
Grants clear of the disks that failed lately come first; one with units on them serves only when no clear one
can and its other units still make the put quorum (a write skips punished disks' shards then), as the allocator
treats avoided disks: one punished disk among a volume's units is common (a unit moved just before the outage
leaves access writing to its old place) and must not stop every PUT. The clustermgr lease must outlast
`ride_out` plus the refill interval.
What changed in the stock since the last look (`changes`) is for the shell to save (statefile.py), so that a
restarted access node takes its grants up again (`restore`) and never writes a bid it took before.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.allocator import BlobSlice, UnusedSpace

GRANTS = 2  # per code mode: each of its own volume when possible, so one bad volume leaves half the stock
# After a grant came back already too short to cover `ride_out` (the allocator could not renew its lease: clustermgr
# is unreachable), this long before the next is asked for: more of the same would only burn bids.
SHORT_BACKOFF = 10.0
RATE_WINDOWS = (10.0, 60.0)  # seconds: the PUT rate is the higher of these windows' averages


@dataclass
class Grant:
    vid: int
    disks: tuple[int, ...]  # of the volume's units, in unit order
    first_bid: int  # as granted: names the grant (no other grant of the cluster holds that bid)
    next_bid: int
    bids_left: int
    bytes_left: int
    usable_until: float


@dataclass(frozen=True)
class Want:
    """A grant to ask an allocator for: `bids` bids sharing `bytes` bytes, in none of `exclude_vids`."""

    mode: CodeMode
    bids: int
    bytes: int
    exclude_vids: frozenset[int]


@dataclass
class RateMeter:
    """Bids and bytes allocated per second, per code mode, over the last `RATE_WINDOWS`."""

    _events: dict[CodeMode, deque[tuple[float, int, int]]] = field(default_factory=dict)

    def record(self, mode: CodeMode, bids: int, size: int, now: float) -> None:
        self._events.setdefault(mode, deque()).append((now, bids, size))

    def rate(self, mode: CodeMode, now: float) -> tuple[float, float]:
        """(bids, bytes) per second."""
        events = self._events.get(mode, deque())
        while events and events[0][0] < now - max(RATE_WINDOWS):
            events.popleft()
        best = (0.0, 0.0)
        for window in RATE_WINDOWS:
            recent = [e for e in events if e[0] >= now - window]
            if recent:  # over the time the window saw PUTs: a stream that began 3 s ago is not a tenth as fast
                seconds = max(1.0, min(window, now - recent[0][0]))
                best = (max(best[0], sum(e[1] for e in recent) / seconds),
                        max(best[1], sum(e[2] for e in recent) / seconds))
        return best

    def modes(self, now: float) -> list[CodeMode]:
        """The modes allocated in the longest window."""
        return [m for m in self._events if self.rate(m, now) != (0.0, 0.0)]


@dataclass
class Standby:
    ride_out: float  # seconds of PUTs the stock carries; 0 turns it off
    headroom: float
    min_bids: int  # per grant
    min_bytes: int
    max_bids: int
    max_bytes: int
    meter: RateMeter = field(default_factory=RateMeter)
    _grants: dict[CodeMode, list[Grant]] = field(default_factory=dict, init=False)
    _unused: list[UnusedSpace] = field(default_factory=list, init=False)
    _short_until: dict[CodeMode, float] = field(default_factory=dict, init=False)
    _changed: dict[int, tuple[CodeMode, Grant] | None] = field(default_factory=dict, init=False)  # by first bid

    def record(self, mode: CodeMode, bids: int, size: int, now: float) -> None:
        """A PUT allocated `bids` bids and `size` bytes of `mode`: what sizes the stock."""
        self.meter.record(mode, bids, size, now)

    def share(self, mode: CodeMode, now: float) -> tuple[int, int]:
        """What one grant of `mode` should hold: (bids, bytes)."""
        bid_rate, byte_rate = self.meter.rate(mode, now)
        scale = self.ride_out * self.headroom / GRANTS
        return (min(self.max_bids, max(self.min_bids, math.ceil(bid_rate * scale))),
                min(self.max_bytes, max(self.min_bytes, math.ceil(byte_rate * scale))))

    def wanted(self, modes: Iterable[CodeMode], now: float) -> list[Want]:
        """The grants to fetch now for `modes`: one per missing good grant (fresh for `ride_out` more seconds
        and holding at least half its share), away from the volumes of the good ones."""
        if self.ride_out <= 0:
            return []
        wants = []
        for mode in dict.fromkeys([*modes, *self.meter.modes(now)]):
            self._expire(mode, now)
            if now < self._short_until.get(mode, 0.0):
                continue
            bids, size = self.share(mode, now)
            good = [g for g in self._grants.get(mode, []) if self._good(g, bids, size, now)]
            exclude = frozenset(g.vid for g in good)
            wants += [Want(mode, bids, size, exclude)] * max(0, GRANTS - len(good))
        return wants

    def add(self, mode: CodeMode, granted: BlobSlice, size: int, disks: Sequence[int], asked_at: float) -> None:
        """Hold a grant the allocator answered to a request sent at `asked_at`. A good one replaces the grants
        that are no longer good (the allocators answer: what they held is not needed); one already too short
        is only added, and no other is asked for during `SHORT_BACKOFF`."""
        bids, share_bytes = self.share(mode, asked_at)
        grant = Grant(vid=granted.vid, disks=tuple(disks), first_bid=granted.min_bid, next_bid=granted.min_bid,
                      bids_left=granted.count, bytes_left=size, usable_until=asked_at + granted.usable_for)
        held = self._grants.setdefault(mode, [])
        if not self._good(grant, bids, share_bytes, asked_at):
            self._short_until[mode] = asked_at + SHORT_BACKOFF
        else:
            for old in [g for g in held if not self._good(g, bids, share_bytes, asked_at)]:
                self._drop(mode, old)
        held.append(grant)
        self._changed[grant.first_bid] = (mode, grant)

    def restore(self, mode: CodeMode, grant: Grant) -> None:
        """Hold a grant as it was saved (its `usable_until` on this process's clock)."""
        self._grants.setdefault(mode, []).append(grant)

    def take(self, mode: CodeMode, size: int, blobs: int, now: float, excluded_vids: Collection[int],
             avoided_disks: Collection[int], writable: Callable[[frozenset[int]], bool]) -> BlobSlice | None:
        """`blobs` consecutive bids and `size` bytes for one object, from the grant nearest its end that can
        take it, clear of `avoided_disks` if one can; else from one whose units off them are `writable` (the put
        quorum holds with those unit indexes alone); None when none can."""
        self._expire(mode, now)
        fits = [g for g in self._grants.get(mode, [])
                if g.bids_left >= blobs and g.bytes_left >= size and g.vid not in excluded_vids]
        avoided = set(avoided_disks)
        reachable = {id(g): frozenset(i for i, disk in enumerate(g.disks) if disk not in avoided) for g in fits}
        usable = ([g for g in fits if len(reachable[id(g)]) == len(g.disks)]
                  or [g for g in fits if writable(reachable[id(g)])])
        if not usable:
            return None
        grant = min(usable, key=lambda g: g.usable_until)
        first = grant.next_bid
        grant.next_bid += blobs
        grant.bids_left -= blobs
        grant.bytes_left -= size
        if grant.bids_left == 0:
            self._drop(mode, grant)
        else:
            self._changed[grant.first_bid] = (mode, grant)
        return BlobSlice(vid=grant.vid, min_bid=first, count=blobs, usable_for=grant.usable_until - now)

    def held(self, now: float) -> dict[CodeMode, tuple[int, int, float]]:
        """Per mode: bids and bytes that can still be written, and seconds until the last of them can't."""
        for mode in self._grants:
            self._expire(mode, now)
        return {mode: (sum(g.bids_left for g in grants), sum(g.bytes_left for g in grants),
                       max((g.usable_until - now for g in grants), default=0.0))
                for mode, grants in self._grants.items()}

    def returned(self) -> list[UnusedSpace]:
        """Bytes of grants given up, to hand back with the next allocation (once)."""
        unused, self._unused = self._unused, []
        return unused

    def changes(self) -> tuple[list[tuple[CodeMode, Grant]], list[int]]:
        """What changed since the last call (once): (mode, a copy of the grant) of each grant added or taken from,
        and the first bids of the grants dropped."""
        changed, self._changed = self._changed, {}
        kept = [(held[0], replace(held[1])) for held in changed.values() if held is not None]
        return kept, [first_bid for first_bid, held in changed.items() if held is None]

    def _good(self, grant: Grant, bids: int, size: int, now: float) -> bool:
        return (grant.usable_until >= now + self.ride_out and 2 * grant.bids_left >= bids
                and 2 * grant.bytes_left >= size)

    def _expire(self, mode: CodeMode, now: float) -> None:
        for grant in [g for g in self._grants.get(mode, []) if g.usable_until <= now]:
            self._drop(mode, grant)

    def _drop(self, mode: CodeMode, grant: Grant) -> None:
        """Let a grant go, its unused bytes handed back to the allocator."""
        self._grants[mode].remove(grant)
        self._changed[grant.first_bid] = None
        if grant.bytes_left > 0:
            self._unused.append(UnusedSpace(vid=grant.vid, size=grant.bytes_left, bids=grant.bids_left))
