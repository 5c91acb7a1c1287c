"""One active scheduler, elected through a lease record in clustermgr's kv, changed only by CAS.

The holder renews the record (bumping its term) every third of `ttl`; it counts itself active until `ttl`
after the start of its last successful renewal. A standby takes the record over once it has seen it
unchanged for `ttl` by its own clock, which starts after that renewal committed, bumping the epoch. Timing
alone would be safe only if clocks ran at one rate and no process paused; so every state change a holder
asks of clustermgr (and of a blobnode's chunks) carries its epoch, and the store refuses those of a superseded
epoch (`Fenced`).

An epoch belongs to the process that won it, not to its name: only that process renews it. A process that
finds its own name in the record without having won that epoch (a restart under the same name) takes the
record over at once with the next epoch, so the process it replaces, should it still run (paused, cut off),
is fenced like any superseded holder. A process that did win an epoch once and finds its name under another
one was superseded by a namesake: it waits like any standby. The record is never deleted: its epoch only grows
(blobnodes remember the highest they saw).
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
        self.epoch = 0  # the epoch this process won last (0: none yet), the only one it renews

    def decide(self, record: LeaderRecord | None, now: float) -> Claim | None:
        """What to write given the record just read at `now` (monotonic), or None to wait."""
        if record is None:
            return Claim(None, LeaderRecord(host=self.me, term=1, epoch=1))
        if record.host == self.me and record.epoch == self.epoch:
            return Claim(record, LeaderRecord(host=self.me, term=record.term + 1, epoch=record.epoch))
        if record.host == self.me and not self.epoch:
            return self._take_over(record)
        self.active_until = 0.0  # someone else holds it
        if record != self.seen:
            self.seen, self.seen_since = record, now
            return None
        if now - self.seen_since >= self.ttl:
            return self._take_over(record)
        return None

    def _take_over(self, record: LeaderRecord) -> Claim:
        return Claim(record, LeaderRecord(host=self.me, term=record.term + 1, epoch=record.epoch + 1))

    def won(self, claim: Claim, started: float) -> None:
        """`claim`, sent at `started`, committed."""
        self.epoch = claim.record.epoch
        self.active_until = started + self.ttl

    def lost(self) -> None:
        self.active_until = 0.0

    def active(self, now: float) -> bool:
        return now < self.active_until

    @property
    def leader(self) -> str | None:
        return self.me if self.active_until else self.seen.host if self.seen else None
