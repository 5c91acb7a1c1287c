"""One blob's shards on the wire: write a stripe with a put quorum, read a byte range with a
degraded-read fallback. Codec work runs in threads (ISA-L releases the GIL); the loop only waits.
The verdicts (quorum, what a failed read means) are `quorum.py`'s; the byte math is `stripes.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from libs.ec import Codec, NotEnoughShards
from libs.proto.blobnode import NEEDS_REPAIR, ShardState, shard_state
from libs.proto.cluster import VolumeInfo
from libs.rpc.errors import RpcError, Unavailable
from services.access.metrics import DEGRADED_READS, HEDGED_READS, QUORUM_MISSES
from services.access.quorum import decide_put, unreadable
from services.access.stripes import ShardRead, assemble, shard_reads
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import VolumeCache

log = logging.getLogger(__name__)


@dataclass
class BlobWrite:
    """What happened to one blob's shards: which landed, which did not (to repair or clean up)."""

    vid: int
    bid: int
    written: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    missing: tuple[int, ...] = ()  # shards owed a repair: every one not written


class ShardIO:
    """Shard calls to a volume's units, refreshing the volume once when a unit has moved."""

    def __init__(self, blobnodes: BlobnodeClient, volumes: VolumeCache, timeout: float) -> None:
        self.blobnodes = blobnodes
        self.volumes = volumes
        self.timeout = timeout

    async def put(self, vid: int, index: int, bid: int, data: memoryview) -> int:
        return await self.volumes.on_unit(vid, index, lambda u: self.blobnodes.put_shard(
            u.host, u.disk_id, u.vuid, bid, data, timeout=self.timeout))

    async def get(self, vid: int, index: int, bid: int, offset: int, size: int) -> bytes:
        return await self.volumes.on_unit(vid, index, lambda u: self.blobnodes.get_shard(
            u.host, u.disk_id, u.vuid, bid, offset, size, timeout=self.timeout))


async def write_blob(io: ShardIO, codec: Codec, volume: VolumeInfo, bid: int, data: bytes) -> BlobWrite:
    """Encode and write every shard in parallel; succeed once the put quorum (or the AZ-down rule)
    holds. Raises `BlobWriteFailed` naming the blob when it does not."""
    shards = await asyncio.to_thread(codec.encode, data)
    results = await asyncio.gather(*(io.put(volume.vid, i, bid, shard) for i, shard in enumerate(shards)),
                                   return_exceptions=True)
    outcome = BlobWrite(volume.vid, bid)
    for index, result in enumerate(results):
        if isinstance(result, BaseException):
            outcome.failed[index] = f"{type(result).__name__}: {result}"
        else:
            outcome.written.append(index)
    decision = decide_put(codec.tactic, set(outcome.written))
    outcome.missing = decision.missing
    if not decision.ok:
        QUORUM_MISSES.inc()
        raise BlobWriteFailed(outcome, decision.reason)
    return outcome


class BlobWriteFailed(Unavailable):
    def __init__(self, outcome: BlobWrite, reason: str) -> None:
        super().__init__(f"blob {outcome.vid}/{outcome.bid}: {reason}; failures: {outcome.failed}")
        self.outcome = outcome


@dataclass
class BlobRead:
    data: bytes
    bad: dict[int, ShardState]  # shard index -> what its blobnode said

    def to_repair(self) -> list[int]:
        """Shards whose blobnode says they are gone or corrupt (not merely unreachable or slow)."""
        return sorted(i for i, state in self.bad.items() if state in NEEDS_REPAIR)


async def read_blob(io: ShardIO, codec: Codec, vid: int, bid: int, blob_len: int, start: int, end: int,
                    hedge_after: float) -> BlobRead:
    """Bytes [start, end) of a blob: from the data shards that hold them when they answer in time,
    otherwise rebuilt from any N shards of the same shard-byte range (degraded read)."""
    plan = shard_reads(codec.tactic, blob_len, start, end)
    if not plan:
        return BlobRead(b"", {})
    tasks = {r.shard_index: asyncio.create_task(io.get(vid, r.shard_index, bid, r.offset, r.length))
             for r in plan}
    done, pending = await asyncio.wait(tasks.values(), timeout=hedge_after)
    bad = {i: shard_state(exc) for i, t in tasks.items() if t in done and (exc := t.exception()) is not None}
    if not bad and not pending:
        return BlobRead(assemble(plan, [t.result() for t in tasks.values()]), {})
    for task in pending:
        task.cancel()
    if pending:
        HEDGED_READS.inc()
    return await _degraded(io, codec, vid, bid, plan, bad)


async def _degraded(io: ShardIO, codec: Codec, vid: int, bid: int, plan: list[ShardRead],
                    bad: dict[int, ShardState]) -> BlobRead:
    """Read one common shard range [lo, hi) from every shard not known bad, and as soon as the
    answers suffice, rebuild the data shards the plan needs and cut its pieces out of them."""
    t = codec.tactic
    lo = min(r.offset for r in plan)
    hi = max(r.offset + r.length for r in plan)

    async def fetch(index: int) -> tuple[int, bytes | RpcError]:
        try:
            return index, await io.get(vid, index, bid, lo, hi - lo)
        except RpcError as exc:
            return index, exc

    tasks = [asyncio.create_task(fetch(i)) for i in range(t.total) if i not in bad]
    pieces: list[bytes | None] = [None] * t.total
    needed = [r.shard_index for r in plan]
    rebuilt: dict[int, bytes] | None = None
    try:
        for next_done in asyncio.as_completed(tasks):
            index, result = await next_done
            if isinstance(result, RpcError):
                bad[index] = shard_state(result)
                continue
            pieces[index] = result
            enough = sum(p is not None for p in pieces[: t.global_count]) >= t.n
            if enough or all(pieces[i] is not None for i in needed):
                rebuilt = await _rebuild(codec, pieces, needed)
                if rebuilt is not None:
                    break
    finally:
        for task in tasks:
            task.cancel()
    if rebuilt is None:
        raise unreadable(t, vid, bid, bad, sum(p is not None for p in pieces))
    if bad:
        DEGRADED_READS.inc()
        log.warning("degraded read of blob %d/%d; bad shards %s", vid, bid, bad)
    return BlobRead(assemble(plan, [rebuilt[r.shard_index][r.offset - lo: r.offset - lo + r.length] for r in plan]),
                    bad)


async def _rebuild(codec: Codec, pieces: list[bytes | None], needed: list[int]) -> dict[int, bytes] | None:
    """The needed data shards, rebuilt from `pieces` where missing; None when too few pieces are here."""
    missing = [i for i in needed if pieces[i] is None]
    rebuilt: dict[int, bytes] = {}
    if missing:
        try:
            rebuilt = {i: bytes(shard) for i, shard in
                       (await asyncio.to_thread(codec.reconstruct, pieces, missing)).items()}
        except NotEnoughShards:
            return None
    return {i: rebuilt[i] if i in rebuilt else _present(pieces[i]) for i in needed}


def _present(piece: bytes | None) -> bytes:
    assert piece is not None  # every needed shard is either present or rebuilt
    return piece
