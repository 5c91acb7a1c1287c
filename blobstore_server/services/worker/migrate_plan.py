"""The migrate engine's decisions, free of I/O: which bids of a unit move, and how each one does.

Input: the shard list of every unit of the volume (None where the list could not be read, the source's
too when its disk is broken) and of the destination. A bid is a candidate when any unit lists it; it is
left alone when `rules.plan_repair` says so (the one never-resurrect rule: mark-deleted anywhere, or no
other unit holds it). A candidate the destination already holds with the right size (and the source's
CRC, when the source listed it) is done: a redone task resumes. The rest are copied from the source when
it lists the shard as normal, and rebuilt from the other units otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from blobstore_server.libs.proto.blobnode import ShardInfo, ShardState
from blobstore_server.services.worker.rules import plan_repair

MARK_DELETED = "mark_deleted"
Listing = Mapping[int, ShardInfo]  # bid -> the unit's index entry


class Action(StrEnum):
    COPY = "copy"  # read the source's shard
    REBUILD = "rebuild"  # decode it from the other units
    DONE = "done"  # the destination already holds it (a resumed task)
    LEFT = "left"  # never written: the blob is being deleted or exists nowhere else


@dataclass(frozen=True)
class BidMove:
    bid: int
    action: Action
    size: int = 0  # the shard's size (0 for LEFT)
    crc: int | None = None  # the CRC the destination must end with, when known before writing
    sources: tuple[int, ...] = ()  # for REBUILD: unit indexes believed to hold the shard
    replace: bool = False  # the destination holds other bytes under this bid: delete them first
    why: str = ""  # for LEFT


def _state(listing: Listing | None, bid: int) -> ShardState:
    if listing is None:
        return ShardState.UNREACHABLE
    info = listing.get(bid)
    if info is None:
        return ShardState.MISSING
    return ShardState.DELETED if info.status == MARK_DELETED else ShardState.PRESENT


def plan_bid(bid: int, index: int, units: Sequence[Listing | None], destination: Listing) -> BidMove:
    """How shard `index` of blob `bid` gets to the destination. `units[index]` is the source's list."""
    states = [_state(listing, bid) for listing in units]
    held = destination.get(bid)
    if held is not None and held.status == MARK_DELETED:
        states.append(ShardState.DELETED)  # the destination is no unit; its mark counts all the same
    repair = plan_repair({index}, states)
    if repair.skip:
        return BidMove(bid, Action.LEFT, why=repair.skip)
    source = units[index]
    own = source.get(bid) if source is not None else None
    sizes = Counter(info.size for i, listing in enumerate(units) if i != index and listing is not None
                    and (info := listing.get(bid)) is not None)
    size = _expected_size(own, sizes, held)
    crc = own.crc if own is not None else None
    if held is not None and held.size == size and crc in (None, held.crc):
        return BidMove(bid, Action.DONE, size, held.crc)
    action = Action.COPY if own is not None else Action.REBUILD
    return BidMove(bid, action, size, crc, repair.sources, replace=held is not None)


def _expected_size(own: ShardInfo | None, sizes: Counter[int], held: ShardInfo | None) -> int:
    """The shard's size: the source's; else the one most other units hold (every shard of a blob has the
    same size); else, for a bid only the destination lists while some unit is unreachable, the held one."""
    if own is not None:
        return own.size
    if sizes:
        return sizes.most_common(1)[0][0]
    return held.size if held is not None else 0


def plan_unit(index: int, units: Sequence[Listing | None], destination: Listing) -> list[BidMove]:
    """Every bid any unit lists, in bid order, with how it moves."""
    bids = sorted({bid for listing in units if listing is not None for bid in listing})
    return [plan_bid(bid, index, units, destination) for bid in bids]


def late_moves(index: int, units: Sequence[Listing | None], destination: Listing, planned: Collection[int],
               data_shards: int) -> list[BidMove]:
    """Bids the plan's lists did not show (a PUT in flight then, its shard on the source written before the seal)
    that move all the same: each held by at least `data_shards` other units (an acknowledged blob, rebuildable),
    the destination lacking it. Fewer is a PUT still on its way or one that failed: not the unit's to carry."""
    moves = []
    for bid in sorted({bid for listing in units if listing is not None for bid in listing} - set(planned)):
        held = sum(_state(listing, bid) is ShardState.PRESENT for i, listing in enumerate(units) if i != index)
        move = plan_bid(bid, index, units, destination)
        if held >= data_shards and move.action in (Action.COPY, Action.REBUILD):
            moves.append(move)
    return moves


def pieces(moves: Sequence[BidMove], piece_bytes: int) -> Iterator[list[BidMove]]:
    """The moves that write, in groups of at most `piece_bytes` of shard data (a larger shard goes alone)."""
    group: list[BidMove] = []
    size = 0
    for move in moves:
        if move.action not in (Action.COPY, Action.REBUILD):
            continue
        if group and size + move.size > piece_bytes:
            yield group
            group, size = [], 0
        group.append(move)
        size += move.size
    if group:
        yield group
