"""One blob's shards on the wire: write a stripe with a put quorum, read a byte range with a
degraded-read fallback. Codec work runs in threads (ISA-L releases the GIL); the loop only waits.
The verdicts (quorum, what a failed read means) are `quorum.py`'s; the byte math is `stripes.py`'s;
what every shard call taught about its disk goes to the health table (`health.py`), which decides
which units a PUT skips and which shards a GET asks last.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, ParamSpec, TypeVar

from blobstore_server.libs.ec import Codec, NotEnoughShards, Tactic
from blobstore_server.libs.proto.blobnode import NEEDS_REPAIR, ShardState, shard_state
from blobstore_server.libs.proto.cluster import Unit, VolumeInfo
from blobstore_server.libs.rpc.client import Payload
from blobstore_server.libs.rpc.errors import ChunkFull, RpcError, ShardExists, Unavailable
from blobstore_server.libs.rpc.splice import BodySpan
from blobstore_server.services.access.health import HealthTable
from blobstore_server.services.access.metrics import DEGRADED_READS, HEDGED_READS, QUORUM_MISSES, TAIL_HEDGED_READS
from blobstore_server.services.access.quorum import decide_put, units_to_skip, unreadable
from blobstore_server.services.access.stripes import Piece, ShardRead, assemble, shard_reads
from blobstore_server.services.access.tail import TailDelay
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import VolumeCache

T = TypeVar("T")
P = ParamSpec("P")
INLINE_CODEC_BYTES = 64 << 10
DISK_TROUBLE = frozenset({ShardState.UNREACHABLE, ShardState.ERROR})  # the disk's fault, not the shard's

log = logging.getLogger(__name__)


@dataclass
class BlobWrite:
    """What happened to one blob's shards: which landed, which did not (to repair or clean up)."""

    vid: int
    bid: int
    written: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    missing: tuple[int, ...] = ()  # shards owed a repair: every one not written
    conflicts: list[int] = field(default_factory=list)  # shards the blobnode holds with other bytes


class ShardIO:
    """Shard calls to a volume's units, refreshing the volume once when a unit has moved, and noting in
    `health` how each disk answered."""

    def __init__(self, blobnodes: BlobnodeClient, volumes: VolumeCache, timeout: float, health: HealthTable,
                 put_grace: float, tail: TailDelay | None = None, tail_bytes: int = 0,
                 on_full: Callable[[int], None] = lambda vid: None) -> None:
        self.blobnodes = blobnodes
        self.on_full = on_full  # told each vid whose blobnode answered ChunkFull: it is retired everywhere
        self.volumes = volumes
        self.timeout = timeout
        self.health = health
        self.put_grace = put_grace
        self.tail = tail  # when a read of at most `tail_bytes` per shard asks other shards too (`read_blob`)
        self.tail_bytes = tail_bytes

    async def put(self, vid: int, index: int, bid: int, data: memoryview) -> int:
        try:
            return await self.volumes.on_unit(vid, index, lambda u: self._noted(u, self.blobnodes.put_shard(
                u.host, u.disk_id, u.vuid, bid, data, timeout=self.timeout), read=False))
        except ChunkFull:
            self.health.punish_volume(vid, time.monotonic())
            self.on_full(vid)
            raise

    async def get(self, vid: int, index: int, bid: int, offset: int, size: int) -> Payload:
        return await self.volumes.on_unit(vid, index, lambda u: self._noted(u, self.blobnodes.get_shard(
            u.host, u.disk_id, u.vuid, bid, offset, size, timeout=self.timeout), read=True))

    async def get_many(self, vid: int, index: int, ranges: Sequence[tuple[int, int, int]], deferred: bool = False
                       ) -> Sequence[Payload | BodySpan | BaseException]:
        """Ranges (bid, offset, size) of shard `index` of several blobs, in one request to its unit; `deferred`:
        left in its answer's socket (`BlobnodeClient.get_shards`)."""
        return await self.volumes.on_unit(vid, index, lambda u: self._noted(u, self.blobnodes.get_shards(
            u.host, u.disk_id, u.vuid, ranges, timeout=self.timeout, deferred=deferred), read=True))

    async def _noted(self, unit: Unit, call: Awaitable[T], *, read: bool) -> T:
        started = time.monotonic()
        try:
            result = await call
        except RpcError as exc:
            if shard_state(exc) in DISK_TROUBLE:
                self.health.failed(unit.disk_id, time.monotonic())
            raise
        now = time.monotonic()
        self.health.succeeded(unit.disk_id, now, now - started if read else None)
        return result


async def write_blob(io: ShardIO, codec: Codec, volume: VolumeInfo, bid: int, data: bytes) -> BlobWrite:
    """Encode and write every shard in parallel, but for units on punished disks while the quorum
    allows; succeed once the put quorum (or the AZ-down rule) holds and the other shards landed or had
    `io.put_grace` seconds more: a shard still on its way then is abandoned to repair and its disk
    punished, so a host that stopped answering costs one PUT the grace, not every PUT the shard timeout.
    Raises `BlobWriteFailed` naming the blob when the quorum does not hold."""
    now = time.monotonic()
    skip = units_to_skip(codec.tactic, {i for i, u in enumerate(volume.units) if io.health.punished(u.disk_id, now)})
    shards = await _codec_call(len(data), codec.encode, data)
    outcome = BlobWrite(volume.vid, bid)
    for index in sorted(skip):
        outcome.failed[index] = f"skipped: disk {volume.units[index].disk_id} is punished after failing"
    tasks = {asyncio.create_task(io.put(volume.vid, i, bid, shards[i])): i for i in range(len(shards)) if i not in skip}
    stripe = _StripeWrite(codec.tactic, outcome, tasks)
    try:
        await stripe.quorum
        if stripe.left:
            timer = asyncio.get_running_loop().call_later(io.put_grace, stripe.give_up)
            try:
                await stripe.settled
            finally:
                timer.cancel()
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
    for index in tasks.values():
        if index not in outcome.failed and index not in outcome.written:
            outcome.failed[index] = f"not written {io.put_grace} s after the put quorum held"
            io.health.failed(volume.units[index].disk_id, time.monotonic())
    outcome.written.sort()
    decision = decide_put(codec.tactic, set(outcome.written))
    outcome.missing = decision.missing
    if not decision.ok:
        QUORUM_MISSES.inc()
        raise BlobWriteFailed(outcome, decision.reason)
    return outcome


class _StripeWrite:
    """A stripe's shard puts as they end, noted in `outcome` by a callback each (asyncio.wait re-armed a callback on
    every pending put at each end): `quorum` resolves once the put quorum holds or every put ended, `settled` once
    every put ended or `give_up` was called."""

    def __init__(self, tactic: Tactic, outcome: BlobWrite, tasks: dict[asyncio.Task[int], int]) -> None:
        self.tactic, self.outcome, self.tasks = tactic, outcome, tasks
        loop = asyncio.get_running_loop()
        self.quorum: asyncio.Future[None] = loop.create_future()
        self.settled: asyncio.Future[None] = loop.create_future()
        self.left = len(tasks)
        if not tasks:
            self.give_up()
        for task in tasks:
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[int]) -> None:
        if self.settled.done():
            if not task.cancelled():
                task.exception()  # taken: it ended after the grace, noted as not written
            return
        index = self.tasks[task]
        exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
        if exc is None:
            self.outcome.written.append(index)
        else:
            self.outcome.failed[index] = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ShardExists):
                self.outcome.conflicts.append(index)
        self.left -= 1
        if not self.left:
            self.give_up()
        elif not self.quorum.done() and decide_put(self.tactic, set(self.outcome.written)).ok:
            self.quorum.set_result(None)

    def give_up(self) -> None:
        for future in (self.quorum, self.settled):
            if not future.done():
                future.set_result(None)


class BlobWriteFailed(Unavailable):
    def __init__(self, outcome: BlobWrite, reason: str) -> None:
        super().__init__(f"blob {outcome.vid}/{outcome.bid}: {reason}; failures: {outcome.failed}")
        self.outcome = outcome
        self.reason = reason


Sent = Piece | BodySpan  # bytes to send: in memory, or still in a blobnode's answer


@dataclass
class BlobRead:
    data: Sequence[Sent]  # to send in order
    bad: dict[int, ShardState]  # shard index -> what its blobnode said

    def to_repair(self) -> list[int]:
        """Shards whose blobnode says they are gone or corrupt (not merely unreachable or slow)."""
        return sorted(i for i, state in self.bad.items() if state in NEEDS_REPAIR)


async def read_blob(io: ShardIO, codec: Codec, volume: VolumeInfo, bid: int, blob_len: int, start: int, end: int,
                    hedge_after: float) -> BlobRead:
    """Bytes [start, end) of a blob: from the data shards that hold them when they answer in time,
    otherwise rebuilt from any N shards of the same shard-byte range (degraded read). A data shard on
    a disk that failed or was slow lately is not waited for: the read is degraded from the start."""
    vid = volume.vid
    plan = shard_reads(codec.tactic, blob_len, start, end)
    if not plan:
        return BlobRead([], {})
    now = time.monotonic()
    late = {i for i, u in enumerate(volume.units) if io.health.read_last(u.disk_id, now)}
    if len(late) > codec.tactic.total - codec.tactic.n:
        late = set()  # too few others to read instead: they all get asked as usual
    if any(r.shard_index in late for r in plan):
        return await _degraded(io, codec, vid, bid, plan, {}, late)
    lo, hi = common_range(plan)
    hedgeable = io.tail is not None and _tail_hedges(plan, lo, hi, io.tail_bytes)
    tail = io.tail.delay() if io.tail is not None and hedgeable else None
    # A read that may hedge asks each data shard for the common range (the same bytes but for a last shard's
    # padding), so that any N answers decode.
    reads = {r.shard_index: (lo, hi - lo) if tail is not None else (r.offset, r.length) for r in plan}
    tasks = {i: asyncio.create_task(io.get(vid, i, bid, *reads[i])) for i in reads}
    if hedgeable:
        _observe(io, list(tasks.values()))
    first_wait = min(tail, hedge_after) if tail is not None else hedge_after
    done, pending = await asyncio.wait(tasks.values(), timeout=first_wait)
    if pending and tail is not None and all(t.exception() is None for t in done):
        hedged = await _tail_hedged(io, codec, volume, bid, plan, tasks, late, hedge_after - first_wait)
        if hedged is not None:
            return hedged
        done = {t for t in tasks.values() if t.done()}
        pending = set(tasks.values()) - done
    bad = {i: shard_state(exc) for i, t in tasks.items() if t in done and (exc := t.exception()) is not None}
    if not bad and not pending:
        return BlobRead(_cut(plan, lo, {i: t.result() for i, t in tasks.items()}, widened=tail is not None), {})
    for index, task in tasks.items():
        if task in pending:
            task.cancel()
            io.health.slow(volume.units[index].disk_id, time.monotonic())
    if pending:
        HEDGED_READS.inc()
    return await _degraded(io, codec, vid, bid, plan, bad, late)


def common_range(plan: Sequence[ShardRead]) -> tuple[int, int]:
    """The shard bytes [lo, hi) covering every read of `plan`: what a decode needs from each of N shards."""
    return min(r.offset for r in plan), max(r.offset + r.length for r in plan)


TAIL_SLACK = 4096  # bytes more than a data shard's own range a hedgeable read may ask of it


def _tail_hedges(plan: Sequence[ShardRead], lo: int, hi: int, limit: int) -> bool:
    """Whether a read may ask other shards early: small (at most `limit` bytes a shard), and each data shard's
    own range close to the common one (a whole blob: all but the last shard's padding)."""
    return hi - lo <= limit and all(hi - lo - r.length <= TAIL_SLACK for r in plan)


def _observe(io: ShardIO, tasks: Collection[asyncio.Task[Payload]]) -> None:
    """Feed the tail estimate the time until every data shard of a read answered (or failed, or was dropped):
    what the read would have waited without a hedge, whether or not it hedged."""
    tail, started, left = io.tail, time.monotonic(), len(tasks)
    assert tail is not None

    def seen(_: asyncio.Task[Payload]) -> None:
        nonlocal left
        left -= 1
        if not left:
            tail.observe(time.monotonic() - started)

    for task in tasks:
        task.add_done_callback(seen)


def _cut(plan: Sequence[ShardRead], lo: int, pieces: dict[int, Payload], widened: bool) -> list[Piece]:
    """The plan's pieces; cut out of the common range [lo, ...) when that is what was read."""
    if not widened:
        return assemble(plan, [pieces[r.shard_index] for r in plan])
    return assemble(plan, [pieces[r.shard_index][r.offset - lo:r.offset - lo + r.length] for r in plan])


async def _tail_hedged(io: ShardIO, codec: Codec, volume: VolumeInfo, bid: int, plan: Sequence[ShardRead],
                       tasks: dict[int, asyncio.Task[Payload]], late: Collection[int], within: float
                       ) -> BlobRead | None:
    """Data shards still out past the tail delay: ask as many other shards (not read last) for the common
    range as N answers need, and decode from whichever N come first, waiting at most `within` seconds.
    None when that does not work out (too few others, a failure, the time up): the caller's hedge then runs.
    A data read outrun by the others is left to finish for `within` seconds (its connection is then reused);
    one still out by then is dropped and its disk read last, as the caller's hedge would."""
    t = codec.tactic
    lo, hi = common_range(plan)
    pieces: list[Payload | None] = [None] * t.total
    for index, task in tasks.items():
        if task.done():
            pieces[index] = task.result()
    need = t.n - sum(p is not None for p in pieces)
    others = [i for i in range(t.global_count) if i not in tasks and i not in late][:need]
    if len(others) < need:
        return None
    TAIL_HEDGED_READS.inc()
    extra = {asyncio.create_task(io.get(volume.vid, i, bid, lo, hi - lo)): i for i in others}
    waiting = {task: index for index, task in tasks.items() if not task.done()} | extra
    needed = [r.shard_index for r in plan]
    deadline = time.monotonic() + within
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                return None
            for task in done:
                index = waiting.pop(task)
                if task.exception() is not None:
                    return None
                pieces[index] = task.result()
            if sum(p is not None for p in pieces) >= t.n or all(pieces[i] is not None for i in needed):
                rebuilt = await _rebuild(codec, pieces, needed)
                if rebuilt is not None:
                    for task, index in waiting.items():
                        if index in tasks:
                            _outrun(io, task, volume.units[index].disk_id, deadline)
                    return BlobRead(_cut(plan, lo, rebuilt, widened=True), {})
        return None
    finally:
        for task in extra:
            drop_task(task)


def _outrun(io: ShardIO, task: asyncio.Task[Payload], disk_id: int, deadline: float) -> None:
    """Let a data read nobody waits for any more finish until `deadline`; past it, drop it and read its disk last."""
    def give_up() -> None:
        if not task.done():
            task.cancel()
            io.health.slow(disk_id, time.monotonic())

    def finished(done: asyncio.Task[Payload]) -> None:
        timer.cancel()
        drop_task(done)

    timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), give_up)
    task.add_done_callback(finished)


class BlobSpan(NamedTuple):
    """Bytes [start, end) of blob `bid`, which is `blob_len` bytes long."""

    bid: int
    blob_len: int
    start: int
    end: int


async def read_blobs(io: ShardIO, codec: Codec, volume: VolumeInfo, spans: Sequence[BlobSpan],
                     hedge_after: float, deferred: bool = False) -> list[BlobRead]:
    """`read_blob` of several blobs of one volume, in order, with one request per data shard's unit for all of
    them instead of one per blob and unit. A blob whose ranges do not all come back within `hedge_after` is read
    again on its own by `read_blob`, which hedges and degrades as usual; so is every blob when a unit they need
    is on a disk to read last. `deferred`: the bytes stay in the blobnodes' answers (`BodySpan`s, moved on in
    order, each answer finished after) unless any range failed, when every blob is read again on its own."""
    if len(spans) == 1:
        return [await read_blob(io, codec, volume, *spans[0], hedge_after)]
    plans = [shard_reads(codec.tactic, span.blob_len, span.start, span.end) for span in spans]
    got: list[dict[int, Payload | BodySpan]] = [{} for _ in spans]  # per blob: shard index -> its bytes
    now = time.monotonic()
    if not any(io.health.read_last(volume.units[r.shard_index].disk_id, now) for plan in plans for r in plan):
        wanted: dict[int, list[tuple[int, ShardRead]]] = {}
        for k, plan in enumerate(plans):
            for read in plan:
                wanted.setdefault(read.shard_index, []).append((k, read))
        tasks = {index: asyncio.create_task(io.get_many(volume.vid, index, [(spans[k].bid, r.offset, r.length)
                                                                            for k, r in reads], deferred))
                 for index, reads in wanted.items()}
        try:
            _, pending = await asyncio.wait(tasks.values(), timeout=hedge_after)
        except BaseException:  # cancelled: answers already here are finished, not left holding their connections
            for task in tasks.values():
                if task.done() and not task.cancelled() and task.exception() is None:
                    finish_bodies(p for p in task.result() if not isinstance(p, BaseException))
                drop_task(task)
            raise
        whole = True
        for index, task in tasks.items():
            if task in pending:
                drop_task(task)
                io.health.slow(volume.units[index].disk_id, time.monotonic())
            elif task.exception() is None:
                for (k, _), outcome in zip(wanted[index], task.result(), strict=True):
                    if isinstance(outcome, BaseException):
                        whole = False
                    else:
                        got[k][index] = outcome
            else:
                whole = False
        if pending:
            HEDGED_READS.inc()
        if deferred and (pending or not whole):  # spans of an answer go out in order or not at all
            finish_bodies(piece for pieces in got for piece in pieces.values())
            got = [{} for _ in spans]

    async def finish(k: int) -> BlobRead:
        if all(read.shard_index in got[k] for read in plans[k]):
            return BlobRead(assemble(plans[k], [got[k][read.shard_index] for read in plans[k]]), {})
        return await read_blob(io, codec, volume, *spans[k], hedge_after)

    return await all_in_order([finish(k) for k in range(len(spans))])


def finish_bodies(pieces: Iterable[Sent | bytes]) -> None:
    """Finish the blobnode answers `pieces` came from (`splice.SocketBody.finish`): those not moved whole are
    closed, not reused."""
    for piece in pieces:
        if isinstance(piece, BodySpan):
            piece.body.finish()


async def all_in_order(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """The results of `calls`, run together; when one fails, the others are stopped and its error raised."""
    tasks = [asyncio.create_task(call) for call in calls]
    try:
        return [await task for task in tasks]
    finally:
        for task in tasks:
            drop_task(task)


def drop_task(task: asyncio.Task[Any]) -> None:
    """Stop a task nobody will wait for; one that already failed has its error taken, not logged."""
    if task.done():
        if not task.cancelled():
            task.exception()
    else:
        task.cancel()


async def _degraded(io: ShardIO, codec: Codec, vid: int, bid: int, plan: list[ShardRead],
                    bad: dict[int, ShardState], late: Collection[int]) -> BlobRead:
    """Read one common shard range [lo, hi) from every shard not known bad, those on disks to read
    `late` only if the others do not suffice, and as soon as the answers suffice, rebuild the data
    shards the plan needs and cut its pieces out of them."""
    t = codec.tactic
    lo = min(r.offset for r in plan)
    hi = max(r.offset + r.length for r in plan)

    async def fetch(index: int) -> tuple[int, Payload | RpcError]:
        try:
            return index, await io.get(vid, index, bid, lo, hi - lo)
        except RpcError as exc:
            return index, exc

    pieces: list[Payload | None] = [None] * t.total
    needed = [r.shard_index for r in plan]
    rebuilt: dict[int, Payload] | None = None
    for wave in ([i for i in range(t.total) if i not in bad and i not in late], sorted(set(late) - set(bad))):
        tasks = [asyncio.create_task(fetch(i)) for i in wave]
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
        if rebuilt is not None:
            break
    if rebuilt is None:
        raise unreadable(t, vid, bid, bad, sum(p is not None for p in pieces))
    if bad:
        DEGRADED_READS.inc()
        log.warning("degraded read of blob %d/%d; bad shards %s", vid, bid, bad)
    return BlobRead(assemble(plan, [rebuilt[r.shard_index][r.offset - lo: r.offset - lo + r.length] for r in plan]),
                    bad)


async def _codec_call(size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Codec work on `size` bytes: on the event loop when small (ISA-L encodes 64 KiB in well under the
    ~50-100 us of CPU a hop to a thread and back costs), else in a thread."""
    if size <= INLINE_CODEC_BYTES:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


async def _rebuild(codec: Codec, pieces: list[Payload | None], needed: list[int]) -> dict[int, Payload] | None:
    """The needed data shards, rebuilt from `pieces` where missing; None when too few pieces are here."""
    missing = [i for i in needed if pieces[i] is None]
    rebuilt: dict[int, bytes] = {}
    if missing:
        try:
            rebuilt = {i: bytes(shard) for i, shard in
                       (await _codec_call(sum(len(p) for p in pieces if p is not None), codec.reconstruct,
                                          pieces, missing)).items()}
        except NotEnoughShards:
            return None
    return {i: rebuilt[i] if i in rebuilt else _present(pieces[i]) for i in needed}


def _present(piece: Payload | None) -> Payload:
    assert piece is not None  # every needed shard is either present or rebuilt
    return piece
