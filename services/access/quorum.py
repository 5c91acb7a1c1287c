"""When a PUT may be acknowledged, given which shards of a stripe were written (seeds/004 writeToBlobnodes).

Success when at least the mode's put quorum of shards is durable; otherwise, for modes spread over
three or more AZs, also when every shard outside one AZ was written: an AZ being down must not stop
writes, and the data stays recoverable from the surviving AZs. Every shard not written gets a
repair message either way.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from libs.ec import Tactic

Written = Set[int] | Sequence[bool]


@dataclass(frozen=True)
class PutDecision:
    """The verdict on one stripe, with what to repair and a reason fit for an error message."""

    ok: bool
    missing: tuple[int, ...]  # shard indexes not written: send a repair message for each
    reason: str


def decide_put(tactic: Tactic, written: Written) -> PutDecision:
    """Judge one stripe; `written` is the set of shard indexes written, or one bool per shard index."""
    done = _written_set(tactic, written)
    missing = tuple(i for i in range(tactic.total) if i not in done)
    count = f"{len(done)} of {tactic.total} shards written, put quorum {tactic.put_quorum}"
    if len(done) >= tactic.put_quorum:
        return PutDecision(True, missing, count)
    if tactic.az_count < 3:
        return PutDecision(False, missing, count)
    down = sorted({tactic.unit_az(i) for i in missing})
    if len(down) == 1:
        return PutDecision(True, missing, f"{count}; AZ {down[0]} down, every other AZ fully written")
    return PutDecision(False, missing, f"{count}; the missing shards span AZs {down}")


def put_succeeded(tactic: Tactic, written: Written) -> bool:
    return decide_put(tactic, written).ok


def shards_to_repair(tactic: Tactic, written: Written) -> list[int]:
    return list(decide_put(tactic, written).missing)


def _written_set(tactic: Tactic, written: Written) -> frozenset[int]:
    if isinstance(written, Set):
        bad = [i for i in written if not (type(i) is int and 0 <= i < tactic.total)]
        if bad:
            raise ValueError(f"shard indexes {bad} outside 0..{tactic.total - 1}")
        return frozenset(written)
    if len(written) != tactic.total or not all(isinstance(w, bool) for w in written):
        raise ValueError(f"expected {tactic.total} bools, one per shard index, got {written!r}")
    return frozenset(i for i, w in enumerate(written) if w)
