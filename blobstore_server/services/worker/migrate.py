"""The migrate engine: move one unit of a volume to a new chunk the scheduler already created.

Every live bid of the unit is copied from the old chunk, or rebuilt from the other units when the old
one cannot give it (`migrate_plan` decides which, and which bids are left alone). Shards move in pieces
of bounded size, a few at a time, all as background I/O, and each written shard's CRC is checked. The
units are listed again at the end: a blob the first lists missed (a PUT then in flight) moves too when
enough units hold it, and the destination's whole shard list is checked against what should be there
(size AND CRC).
Progress goes to `report` every few seconds and at the end; `report` raising (the task was fenced)
stops the run. `migrate_mb_per_sec` caps what all of the worker's migrations write together.

Every call that changes the destination is preceded by `guard()`, which raises once the task may no longer be
ours (`rules.LeaseDeadline`), and a discard there names the hand-out's token, which the destination's task
fence checks (a refusal, `Fenced`, stops the run: the task is another worker's now).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from isal import isal_zlib

from blobstore_server.libs.ec import Codec, codec_for
from blobstore_server.libs.proto.blobnode import IOClass, ShardInfo
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.scheduler import TaskProgress, WorkTask
from blobstore_server.libs.proto.worker import MigrateStats
from blobstore_server.libs.ratelimit import Pacer
from blobstore_server.libs.rpc.client import Payload
from blobstore_server.libs.rpc.errors import (
    Conflict,
    Fenced,
    NotFound,
    RpcError,
    ShardDeleted,
    ShardExists,
    ShardNotFound,
    Unavailable,
)
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.worker.config import WorkerConfig
from blobstore_server.services.worker.migrate_plan import (
    Action,
    BidMove,
    Listing,
    late_moves,
    pieces,
    plan_bid,
    plan_unit,
)
from blobstore_server.services.worker.rebuild import RepairFailed, rebuild_shards
from blobstore_server.services.worker.rules import LeaseLapsed

log = logging.getLogger(__name__)

Report = Callable[[TaskProgress], Awaitable[None]]
Guard = Callable[[], None]  # raises when the task may no longer be ours: called before each change of the destination


def _unguarded() -> None:
    """The guard of a run no lease times (a test, a tool)."""


class DestinationFailed(Unavailable):
    """The destination cannot take writes (or lost them); a reclaim picks another destination."""


class BlobLost(Exception):
    """Fewer than N shards of the blob exist anywhere: nothing can bring it back."""


class _Progress:
    """The run's counters, handed to `report` at most every `interval` seconds and at the end."""

    def __init__(self, task: WorkTask, moves: Sequence[BidMove], report: Report, interval: float) -> None:
        live = [m for m in moves if m.action is not Action.LEFT]
        done = [m for m in live if m.action is Action.DONE]
        self.task, self.report, self.interval = task, report, interval
        self.total_bytes, self.total_shards = sum(m.size for m in live), len(live)
        self.done_bytes, self.done_shards = sum(m.size for m in done), len(done)
        self.lost: set[int] = set()  # bids of blobs that cannot be rebuilt: the switch names them
        self.last = time.monotonic()

    def snapshot(self) -> TaskProgress:
        return TaskProgress(ref=self.task.ref, done_bytes=self.done_bytes, done_shards=self.done_shards,
                            total_bytes=self.total_bytes, total_shards=self.total_shards, lost_bids=sorted(self.lost))

    async def moved(self, move: BidMove) -> None:
        self.done_bytes += move.size
        self.done_shards += 1
        if time.monotonic() - self.last >= self.interval:
            self.last = time.monotonic()
            await self.report(self.snapshot())

    def planned(self, moves: Sequence[BidMove]) -> None:
        """More moves joined the run (bids written after its plan)."""
        self.total_bytes += sum(m.size for m in moves)
        self.total_shards += len(moves)

    def lost_blob(self, move: BidMove) -> None:
        self.left(move)
        self.lost.add(move.bid)

    def left(self, move: BidMove, done: bool = False) -> None:
        """A bid found deleted while it moved (after it was counted done, if `done`): no longer part of the
        work."""
        self.total_bytes -= move.size
        self.total_shards -= 1
        if done:
            self.done_bytes -= move.size
            self.done_shards -= 1


class UnitMigrator:
    def __init__(self, cluster: ClusterClient, blobnodes: BlobnodeClient, config: WorkerConfig) -> None:
        self.cluster = cluster
        self.blobnodes = blobnodes
        self.config = config
        self.stats = MigrateStats()
        rate = config.migrate_mb_per_sec and config.migrate_mb_per_sec * (1 << 20)
        self.pacer = Pacer(rate, burst=rate / 4) if rate else None  # shared by every task of this worker

    async def migrate(self, task: WorkTask, report: Report, guard: Guard = _unguarded) -> TaskProgress:
        """Bring every live shard of the task's unit onto its destination; the final progress."""
        volume = await self.cluster.get_volume(task.vid)
        units = list(volume.units)
        if units[task.unit_index].vuid != task.source.vuid:
            raise Conflict(f"volume {task.vid} unit {task.unit_index} is {units[task.unit_index].vuid} now, "
                           f"not the task's source {task.source.vuid}")
        units[task.unit_index] = task.source
        listings = await self._list_units(task, units)
        destination = await self._destination_list(task.destination, lane(task))
        moves = plan_unit(task.unit_index, listings, destination)
        progress = _Progress(task, moves, report, self.config.migrate_report_interval)
        codec = codec_for(volume.code_mode, volume.backend)
        for move in moves:
            self.stats.resumed_shards += move.action is Action.DONE
            self.stats.left_shards += move.action is Action.LEFT
        written = {m.bid: (m.size, m.crc) for m in moves if m.action is Action.DONE and m.crc is not None}
        limit = asyncio.Semaphore(self.config.urgent_concurrency if task.urgent else self.config.migrate_concurrency)
        pacer = None if task.urgent else self.pacer

        async def one(move: BidMove) -> None:
            async with limit:
                if pacer is not None:
                    await pacer.wait()
                try:
                    crc = await self._move(task, units, codec, move, guard)
                except BlobLost:
                    progress.lost_blob(move)
                    return
                if pacer is not None:
                    pacer.charge(move.size)
            if crc is None:
                progress.left(move)
                return
            written[move.bid] = (move.size, crc)
            await progress.moved(move)

        async def run(batch: Sequence[BidMove]) -> None:
            for piece in pieces(batch, self.config.migrate_piece_bytes):
                try:
                    async with asyncio.TaskGroup() as group:  # one failure (or a fenced report) stops the rest
                        for move in piece:
                            group.create_task(one(move))
                except ExceptionGroup as failures:
                    raise _telling(failures) from None

        await run(moves)
        late = late_moves(task.unit_index, await self._list_units(task, units),
                          await self._destination_list(task.destination, lane(task)), {m.bid for m in moves},
                          codec.tactic.n)
        if late:
            log.info("volume %d unit %d: %d blobs written after the plan's lists move too", task.vid, task.unit_index,
                     len(late))
            progress.planned(late)
            moves = [*moves, *late]
            await run(late)
        await self._settle(task, units, {m.bid: m for m in moves}, written, progress, guard)
        final = progress.snapshot()
        await report(final)
        log.info("migrated volume %d unit %d to disk %d: %d shards, %d bytes (%s)", task.vid, task.unit_index,
                 task.destination.disk_id, final.done_shards, final.done_bytes,
                 ", ".join(f"{a}: {sum(m.action is a for m in moves)}" for a in Action))
        return final

    async def _list_units(self, task: WorkTask, units: list[Unit]) -> list[Listing | None]:
        """Every unit's shard list (None where it cannot be read; the source's too when it is unreadable)."""
        return await asyncio.gather(*(
            self._list_or_none(unit, lane(task)) if i != task.unit_index or task.source_readable else _nothing()
            for i, unit in enumerate(units)))

    async def _settle(self, task: WorkTask, units: list[Unit], moves: dict[int, BidMove],
                      written: dict[int, tuple[int, int]], progress: _Progress, guard: Guard) -> None:
        """Take off the destination every shard of a blob deleted meanwhile (the plan's rule on fresh lists:
        the new unit must not keep a shard of a blob that is gone), then check that every other shard that
        should be there is, normal, with the size and CRC it was written with (the blobnode computed each CRC
        over the bytes it stored)."""
        listings = await self._list_units(task, units)
        dest, io_class = task.destination, lane(task)
        held = await self._destination_list(dest, io_class)
        for bid in list(held):
            if plan_bid(bid, task.unit_index, listings, held).action is not Action.LEFT:
                continue
            guard()
            try:
                with contextlib.suppress(ShardNotFound):
                    await self._discard(task, bid, io_class)
            except Fenced:
                raise
            except RpcError as exc:
                raise DestinationFailed(f"destination disk {dest.disk_id}: {exc}") from exc
            del held[bid]
            if written.pop(bid, None) is not None:
                progress.left(moves[bid], done=True)
                self.stats.left_shards += 1
        wrong = [bid for bid, (size, crc) in written.items()
                 if (info := held.get(bid)) is None or (info.status, info.size, info.crc) != ("normal", size, crc)]
        if wrong:
            raise DestinationFailed(f"destination disk {dest.disk_id} lacks or garbled {len(wrong)} shards "
                                    f"(first bids {sorted(wrong)[:5]})")

    async def _list(self, unit: Unit, io_class: IOClass) -> dict[int, ShardInfo]:
        return await self.blobnodes.list_all_shards(unit.host, unit.disk_id, unit.vuid, io_class=io_class)

    async def _list_or_none(self, unit: Unit, io_class: IOClass) -> Listing | None:
        try:
            return await self._list(unit, io_class)
        except RpcError as exc:
            log.warning("cannot list unit %d on disk %d: %s", unit.vuid, unit.disk_id, exc)
            return None

    async def _destination_list(self, unit: Unit, io_class: IOClass) -> dict[int, ShardInfo]:
        try:
            return await self._list(unit, io_class)
        except RpcError as exc:
            raise DestinationFailed(f"destination disk {unit.disk_id}: {exc}") from exc

    async def _read(self, unit: Unit, bid: int, io_class: IOClass) -> Payload | RpcError:
        try:
            return await self.blobnodes.get_shard(unit.host, unit.disk_id, unit.vuid, bid,
                                                  timeout=self.config.shard_timeout, io_class=io_class)
        except RpcError as exc:
            return exc

    async def _move(self, task: WorkTask, units: list[Unit], codec: Codec, move: BidMove, guard: Guard
                    ) -> int | None:
        """Copy or rebuild one shard onto the destination; its CRC there, or None if the blob turned out
        deleted meanwhile; BlobLost if it cannot be rebuilt."""
        data: Payload | None = None
        io_class = lane(task)
        if move.action is Action.COPY:
            copied = await self._read(task.source, move.bid, io_class)
            if isinstance(copied, ShardDeleted):
                self.stats.left_shards += 1
                return None
            if not isinstance(copied, RpcError) and len(copied) == move.size and isal_zlib.crc32(copied) == move.crc:
                data = copied
                self.stats.copied_shards += 1
            else:
                log.info("copy of bid %d from disk %d failed (%s); rebuilding it", move.bid, task.source.disk_id,
                         copied if isinstance(copied, RpcError) else "wrong bytes")
        if data is None:
            # Units that did not list the bid come last: a PUT still in flight when they were listed has
            # reached them by now.
            others = [i for i in range(len(units)) if i != task.unit_index and i not in move.sources]
            try:
                rebuilt = await rebuild_shards(codec, lambda i: self._read(units[i], move.bid, io_class),
                                               [*move.sources, *others], [task.unit_index])
            except RepairFailed as exc:
                if not exc.lost:
                    raise
                # Fewer than N shards of this blob exist anywhere: nothing can bring it back, and holding up the
                # rest of the unit for it would leave every other blob one failure closer to loss.
                log.error("LOST blob %d/%d: cannot rebuild unit %d: %s", task.vid, move.bid, task.unit_index, exc)
                self.stats.lost_shards += 1
                raise BlobLost(move.bid) from None
            data = rebuilt[task.unit_index]
            self.stats.rebuilt_shards += 1
        crc = await self._write(task, move, data, io_class, guard)
        self.stats.written_bytes += len(data)
        return crc

    async def _discard(self, task: WorkTask, bid: int, io_class: IOClass) -> None:
        """Discard a shard on the destination, under the hand-out's token and the scheduler's ticket for it (none
        for a task the scheduler did not hand out: a test's, on a chunk no task fence guards)."""
        dest = task.destination
        await self.blobnodes.discard_shard(dest.host, dest.disk_id, dest.vuid, bid, io_class=io_class,
                                           task_token=task.ref.token or None, ticket=task.discard_ticket)

    async def _write(self, task: WorkTask, move: BidMove, data: bytes, io_class: IOClass, guard: Guard) -> int:
        want = isal_zlib.crc32(data)
        host, disk, vuid = task.destination.host, task.destination.disk_id, task.destination.vuid
        try:
            if move.replace:
                guard()
                with contextlib.suppress(NotFound):
                    await self._discard(task, move.bid, io_class)
            for attempt in (1, 2):  # a put whose answer was lost is safe to repeat: same bytes, same shard
                guard()
                try:
                    crc = await self.blobnodes.put_shard(host, disk, vuid, move.bid, data,
                                                         timeout=self.config.shard_timeout, io_class=io_class)
                    break
                except Unavailable:
                    if attempt == 2:
                        raise
        except ShardExists as exc:
            raise DestinationFailed(f"destination disk {disk} holds other bytes under bid {move.bid}") from exc
        except Fenced:
            raise
        except RpcError as exc:
            raise DestinationFailed(f"destination disk {disk}: {exc}") from exc
        if crc != want:
            raise DestinationFailed(f"destination disk {disk} stored bid {move.bid} with CRC {crc}, sent {want}")
        return crc


def lane(task: WorkTask) -> IOClass:
    """Background I/O, or urgent (past the disks' background caps) for a volume one loss from losing blobs."""
    return IOClass.URGENT if task.urgent else IOClass.BACKGROUND


async def _nothing() -> Listing | None:
    return None


def _telling(failures: ExceptionGroup) -> Exception:
    """The one failure of a piece to raise: the task no longer ours first (nothing more is said about it), then a
    failed destination (the task is reclaimed elsewhere)."""
    leaves = list(_leaves(failures))
    return next((e for e in leaves if isinstance(e, LeaseLapsed | Fenced)),
                next((e for e in leaves if isinstance(e, DestinationFailed)), leaves[0]))


def _leaves(group: BaseExceptionGroup) -> Iterator[Exception]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        elif isinstance(exc, Exception):
            yield exc
