"""The worker's repair decisions, free of I/O: what to rebuild from what, and when to write nothing.

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
