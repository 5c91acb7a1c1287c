"""The worker's decisions, free of I/O: what a repair rebuilds from what, and when to write nothing; how long a
task is still the worker's to touch.

Never resurrects a deleted blob: if any shard of the blob is mark-deleted, or no survivor holds it at
all, nothing is written (the delete pipeline owns it). Survivors that turn out missing or corrupt are
rebuilt too; unreachable ones are not ours to judge.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from blobstore_server.libs.proto.blobnode import NEEDS_REPAIR, ShardState


@dataclass(frozen=True)
class RepairPlan:
    rebuild: tuple[int, ...] = ()  # shard indexes to rebuild and write back
    sources: tuple[int, ...] = ()  # shard indexes whose bytes the rebuild may use
    skip: str = ""  # why nothing may be written, if so


def plan_repair(bad: Set[int], states: Sequence[ShardState]) -> RepairPlan:
    """`bad`: the shards reported bad; `states`: what a read of every shard of the blob found."""
    outside = sorted(i for i in bad if not 0 <= i < len(states))
    if outside:
        raise ValueError(f"the blob has no shard index {outside}")
    if ShardState.DELETED in states:
        return RepairPlan(skip="the blob is being deleted")
    if all(states[i] is ShardState.MISSING for i in range(len(states)) if i not in bad):
        return RepairPlan(skip="no shard of the blob exists")
    rebuild = sorted(bad | {i for i, state in enumerate(states) if state in NEEDS_REPAIR})
    sources = [i for i, state in enumerate(states) if state is ShardState.PRESENT and i not in bad]
    return RepairPlan(tuple(rebuild), tuple(sources))


class LeaseLapsed(Exception):
    """The task's lease may have lapsed: the worker touches it no more (another worker may hold it by now)."""


@dataclass
class LeaseDeadline:
    """A worker's own view of its task lease. The scheduler grants `ttl` seconds from when it takes an acquire or
    a renewal, which is after the worker sent it; so counting from the moment the worker SENT its last successful
    one (`since`, monotonic) and stopping `margin` seconds short of `ttl` stops it before the scheduler can hand
    the task to another, clocks running at about one rate. A pause past the deadline (SIGSTOP, a VM frozen) is
    caught at the next check, which every call that changes the destination makes first."""

    ttl: float
    margin: float
    since: float

    @property
    def deadline(self) -> float:
        return self.since + self.ttl - self.margin

    @property
    def renew_interval(self) -> float:
        """How often the worker renews: a few times a lease, so one renewal lost is ridden out."""
        return self.ttl / 3

    def renewed(self, sent: float) -> None:
        """A renewal sent at `sent` succeeded (answers may arrive out of order: the latest send counts)."""
        self.since = max(self.since, sent)

    def check(self, now: float) -> None:
        """LeaseLapsed once `now` has reached the deadline."""
        if now >= self.deadline:
            raise LeaseLapsed(f"no renewal of the task lease sent in the last {now - self.since:.1f} s "
                              f"({self.ttl:g} s lease, {self.margin:g} s kept in hand): it may have lapsed")
