"""One active scheduler, elected through a lease record in clustermgr's kv, changed only by CAS.

The holder renews the record (bumping its term) every third of `ttl`; it counts itself active until `ttl`
after the start of its last successful renewal. A standby takes the record over once it has seen it
unchanged for `ttl` by its own clock, which starts after that renewal committed, bumping the epoch. Timing
alone would be safe only if clocks ran at one rate and no process paused; so every state change a holder
asks of clustermgr carries its epoch, and clustermgr refuses those of a superseded epoch (`Fenced`).
"""

from __future__ import annotations

from dataclasses import dataclass

from blobstore_server.libs.proto.scheduler import LeaderRecord


@dataclass(frozen=True)
class Claim:
    """Replace `expected` (None: no record) by `record`."""

    expected: LeaderRecord | None
    record: LeaderRecord


class Election:
    def __init__(self, me: str, ttl: float) -> None:
        self.me, self.ttl = me, ttl
        self.seen: LeaderRecord | None = None
        self.seen_since = 0.0
        self.active_until = 0.0

    def decide(self, record: LeaderRecord | None, now: float) -> Claim | None:
        """What to write given the record just read at `now` (monotonic), or None to wait."""
        if record is None:
            return Claim(None, LeaderRecord(host=self.me, term=1, epoch=1))
        if record.host == self.me:
            return Claim(record, LeaderRecord(host=self.me, term=record.term + 1, epoch=record.epoch))
        self.active_until = 0.0  # someone else holds it
        if record != self.seen:
            self.seen, self.seen_since = record, now
            return None
        if now - self.seen_since >= self.ttl:
            return Claim(record, LeaderRecord(host=self.me, term=record.term + 1, epoch=record.epoch + 1))
        return None

    def won(self, started: float) -> None:
        """The claim sent at `started` committed."""
        self.active_until = started + self.ttl

    def lost(self) -> None:
        self.active_until = 0.0

    def active(self, now: float) -> bool:
        return now < self.active_until

    @property
    def leader(self) -> str | None:
        return self.me if self.active_until else self.seen.host if self.seen else None
