"""Verdicts on a stripe's shards, free of I/O: when a PUT may be acknowledged, and what a failed read means.

PUT (CubeFS BlobStore's writeToBlobnodes): success when at least the mode's put quorum of shards is durable;
otherwise, for modes spread over three or more AZs, also when every shard outside one AZ was written:
an AZ being down must not stop writes, and the data stays recoverable from the surviving AZs. Every
shard not written gets a repair message either way. Units on punished disks are skipped while the
quorum can be met without them.

GET: a blob that cannot be rebuilt is deleted (404) when any shard says it is being deleted or more
shards are gone than the code can lose; otherwise it is unavailable for now (503).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from blobstore_server.libs.ec import Tactic
from blobstore_server.libs.proto.blobnode import ShardState
from blobstore_server.libs.rpc.errors import NotFound, RpcError, Unavailable

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
    count = f"{len(done)} of {tactic.total} shards written, quorum is {tactic.put_quorum}"
    if len(done) >= tactic.put_quorum:
        return PutDecision(True, missing, count)
    if tactic.az_count < 3:
        return PutDecision(False, missing, count)
    down = sorted({tactic.unit_az(i) for i in missing})
    if len(down) == 1:
        return PutDecision(True, missing, f"{count}; AZ {down[0]} down, every other AZ fully written")
    return PutDecision(False, missing, f"{count}; the missing shards span AZs {down}")


def units_to_skip(tactic: Tactic, punished: Set[int]) -> frozenset[int]:
    """The punished units a PUT does not even try: all of them while the others can still reach the
    quorum, none otherwise (they may be back, and trying costs less than failing the blob)."""
    others = frozenset(range(tactic.total)) - punished
    return frozenset(punished) if decide_put(tactic, others).ok else frozenset()


def _written_set(tactic: Tactic, written: Written) -> frozenset[int]:
    if isinstance(written, Set):
        bad = [i for i in written if not (type(i) is int and 0 <= i < tactic.total)]
        if bad:
            raise ValueError(f"shard indexes {bad} outside 0..{tactic.total - 1}")
        return frozenset(written)
    if len(written) != tactic.total or not all(isinstance(w, bool) for w in written):
        raise ValueError(f"expected {tactic.total} bools, one per shard index, got {written!r}")
    return frozenset(i for i, w in enumerate(written) if w)


def unreadable(tactic: Tactic, vid: int, bid: int, bad: Mapping[int, ShardState], readable: int) -> RpcError:
    """The error for a blob whose data shards could not be rebuilt, given what each bad shard said."""
    gone = sum(state in (ShardState.MISSING, ShardState.DELETED) for state in bad.values())
    if ShardState.DELETED in bad.values():
        return NotFound(f"blob {vid}/{bid} is deleted")
    if gone > tactic.total - tactic.n:
        return NotFound(f"blob {vid}/{bid} is not stored: deleted and purged, or a part of a multipart upload"
                        " not uploaded yet")
    return Unavailable(f"blob {vid}/{bid} cannot be read: {readable} shards readable, {tactic.n} needed;"
                       f" bad shards: {dict(sorted(bad.items()))}")
