"""Scrubbing decisions, free of I/O: where a disk's pass stands, when the next one begins, how fast it reads.

Latent errors (bit rot, a lost sector) sit unseen until a repair needs those bytes, and then the blob may be
short of one more shard than anyone knew. So each disk re-reads every normal shard once per `period`,
checking every 64 KiB block's CRC and the whole shard's, and owes a repair for each shard that fails.

The pace reads what the pass has left within what is left of its period (remaining bytes / remaining time), so a
pass slowed down (background I/O yields to users), restarted or grown by new shards catches up; never above the
cap. When even the cap cannot end the pass within its period (a big, full disk), the pace says by how many seconds
it will be late, and the blobnode shows it (its stat, metrics, heartbeat: `disk list`, the dashboard). A pass that
finds the disk empty ends at once, and the next one begins a period after it began. The `ScrubRecord` is what the disk
keeps across restarts (`services/blobnode/scrubber.py` writes it under the disk's path): a restart resumes the
pass at its cursor, and findings mqproxy has not taken yet are still owed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from blobstore_server.libs.proto.blobnode import ScrubStat, ShardState
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.mqproxy import RepairIn

MAX_OWED = 1000  # findings a disk holds for mqproxy; with this many, the pass waits until some are taken
# What a scrub's read of a listed shard found: read (counted), and whether it owes a repair. A shard deleted,
# mark-deleted or moved on since it was listed is no longer the pass's business.
READ = frozenset({ShardState.PRESENT, ShardState.CORRUPT, ShardState.ERROR})
REPAIR_REASONS = {ShardState.CORRUPT: "corrupt", ShardState.ERROR: "unreadable"}


class ScrubFinding(BaseModel):
    """A shard whose bytes failed their check: corrupt (a CRC) or unreadable (the disk refused)."""

    vuid: int
    bid: int
    reason: str
    found: float  # unix time

    def repair(self) -> RepairIn:
        vuid = Vuid(self.vuid)
        return RepairIn(vid=vuid.vid(), bid=self.bid, bad_indexes=[vuid.index()],
                        reason=f"scrub found this shard {self.reason}")


class ScrubRecord(BaseModel):
    """One disk's scrub: the current pass and its cursor (the next shard is the first at or after (vuid, bid)
    in vuid then bid order), the totals, and the findings mqproxy has not taken yet."""

    running: bool = False
    pass_started: float = 0.0  # unix time the current (or last) pass began; 0: none yet
    vuid: int = 0
    bid: int = 0
    pass_shards: int = 0
    pass_bytes: int = 0
    last_full_pass: float = 0.0  # unix time the last complete pass ended; 0: never
    passes: int = 0
    shards: int = 0
    bytes: int = 0
    corrupt: int = 0
    repairs_queued: int = 0
    owed: list[ScrubFinding] = Field(default_factory=list)


@dataclass(frozen=True)
class ScrubPace:
    """How fast a disk's scrub reads, and whether its pass ends within its period at that speed."""

    rate: float  # bytes per second (0: nothing left to read)
    late: float  # seconds past the end of its period the pass ends, even at the cap (0: on time)


def scrub_pace(remaining: int, left: float, cap: float) -> ScrubPace:
    """Read `remaining` bytes in the `left` seconds the period has left (none or less: overdue), at most `cap`
    bytes per second."""
    if remaining <= 0:
        return ScrubPace(rate=0.0, late=0.0)
    rate = cap if left <= 0 else min(cap, remaining / left)
    return ScrubPace(rate=rate, late=max(0.0, remaining / cap - left))


def pause(size: int, pace: ScrubPace, spent: float = 0.0) -> float:
    """Seconds to rest after reading `size` bytes at `pace`, the read itself having taken `spent` seconds."""
    return max(0.0, size / pace.rate - spent) if size and pace.rate else 0.0


class ScrubState:
    """The record of one disk and the transitions of a pass; the caller persists `record` after them."""

    def __init__(self, record: ScrubRecord) -> None:
        self.record = record

    def wait(self, now: float, period: float) -> float:
        """Seconds until the next pass may begin (0: one is running, or due)."""
        if self.record.running:
            return 0.0
        return max(0.0, self.record.pass_started + period - now)

    def begin(self, now: float) -> None:
        """Start a pass from the first shard, unless one is running (a restart resumes it)."""
        r = self.record
        if not r.running:
            r.running, r.pass_started, r.vuid, r.bid, r.pass_shards, r.pass_bytes = True, now, 0, 0, 0, 0

    def scrubbed(self, vuid: int, bid: int, size: int, state: ShardState, now: float) -> ScrubFinding | None:
        """The read of shard (vuid, bid) of `size` bytes found `state`; the finding it makes, if any."""
        r = self.record
        r.vuid, r.bid = vuid, bid + 1
        if state not in READ:
            return None
        r.pass_shards += 1
        r.shards += 1
        r.pass_bytes += size
        r.bytes += size
        reason = REPAIR_REASONS.get(state)
        if reason is None:
            return None
        r.corrupt += 1
        finding = ScrubFinding(vuid=vuid, bid=bid, reason=reason, found=now)
        if not any((f.vuid, f.bid) == (vuid, bid) for f in r.owed):
            r.owed.append(finding)
        return finding

    def chunk_done(self, vuid: int) -> None:
        self.record.vuid, self.record.bid = vuid + 1, 0

    def finish(self, now: float) -> None:
        r = self.record
        r.running = False
        r.last_full_pass = now
        r.passes += 1

    @property
    def full(self) -> bool:
        """Too many findings wait for mqproxy: read no further until some are taken."""
        return len(self.record.owed) >= MAX_OWED

    def queued(self, taken: list[ScrubFinding]) -> None:
        """mqproxy took these findings' repairs; findings made meanwhile stay owed."""
        done = {(f.vuid, f.bid) for f in taken}
        self.record.owed = [f for f in self.record.owed if (f.vuid, f.bid) not in done]
        self.record.repairs_queued += len(taken)

    def pace(self, remaining: int, period: float, cap: float, now: float) -> ScrubPace:
        """The pace of the current pass, with `remaining` bytes left to read; between passes, of the next one over
        `remaining` bytes (it will have a whole period)."""
        r = self.record
        return scrub_pace(remaining, r.pass_started + period - now if r.running else period, cap)

    def progress(self, remaining: int) -> float:
        """The fraction of the current pass read, `remaining` bytes still to read; 1.0 between passes once one
        ended."""
        r = self.record
        if not r.running:
            return 1.0 if r.passes else 0.0
        total = r.pass_bytes + remaining
        return r.pass_bytes / total if total else 0.0

    def stat(self, remaining: int, period: float, cap: float, now: float) -> ScrubStat:
        """What the blobnode shows of the disk's scrub; `remaining`: as for `pace`."""
        r = self.record
        pace = self.pace(remaining, period, cap, now) if period > 0 else ScrubPace(rate=0.0, late=0.0)
        return ScrubStat(enabled=period > 0, running=r.running, progress=self.progress(remaining),
                         pass_started=r.pass_started, last_full_pass=r.last_full_pass or None, passes=r.passes,
                         shards=r.shards, bytes=r.bytes, corrupt=r.corrupt, repairs_queued=r.repairs_queued,
                         repairs_owed=len(r.owed), rate=pace.rate, late_s=pace.late)
