"""The migrate engine's decisions (services/worker/migrate_plan.py) and the shared rebuild step."""

from __future__ import annotations

import asyncio
import random
from itertools import product

import pytest
from isal import isal_zlib

from blobstore_server.libs.ec import codec_for, parse_code_mode
from blobstore_server.libs.proto.blobnode import ShardInfo
from blobstore_server.libs.rpc.errors import RpcError, ShardNotFound, Unavailable
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

SIZE, CRC = 4096, 77


def shard(bid: int, size: int = SIZE, crc: int = CRC, deleted: bool = False) -> ShardInfo:
    return ShardInfo(bid=bid, vuid=1, offset=0, size=size, crc=crc, status="mark_deleted" if deleted else "normal")


# What one unit's list can say about bid 1: holds it, holds it mark-deleted, lacks it, or could not be listed.
HAS, DEL, LACKS, DOWN = "has", "del", "lacks", "down"


def listing(kind: str) -> Listing | None:
    return {HAS: {1: shard(1)}, DEL: {1: shard(1, deleted=True)}, LACKS: {}, DOWN: None}[kind]


def test_copies_from_a_readable_source_and_rebuilds_when_the_source_cannot_give_it() -> None:
    units = [{1: shard(1, crc=5)}, {1: shard(1)}, {1: shard(1)}]
    assert plan_bid(1, 0, units, {}) == BidMove(1, Action.COPY, SIZE, 5, sources=(1, 2))
    assert plan_bid(1, 0, [None, *units[1:]], {}) == BidMove(1, Action.REBUILD, SIZE, None, sources=(1, 2))
    assert plan_bid(1, 0, [{}, *units[1:]], {}) == BidMove(1, Action.REBUILD, SIZE, None, sources=(1, 2))


def test_never_resurrects_a_blob_being_deleted_or_held_nowhere_else() -> None:
    assert plan_bid(1, 0, [{1: shard(1)}, {1: shard(1, deleted=True)}, {1: shard(1)}], {}).action is Action.LEFT
    assert plan_bid(1, 0, [{1: shard(1, deleted=True)}, {1: shard(1)}], {}).action is Action.LEFT
    assert plan_bid(1, 0, [{1: shard(1)}, {}, {}], {}).why == "no shard of the blob exists"
    assert plan_bid(1, 0, [None, {1: shard(1)}], {1: shard(1, deleted=True)}).action is Action.LEFT


def test_resumes_from_what_the_destination_holds_and_replaces_wrong_bytes() -> None:
    units = [{1: shard(1, crc=5)}, {1: shard(1)}]
    assert plan_bid(1, 0, units, {1: shard(1, crc=5)}) == BidMove(1, Action.DONE, SIZE, 5)
    assert plan_bid(1, 0, units, {1: shard(1, crc=6)}).replace
    assert plan_bid(1, 0, units, {1: shard(1, size=SIZE - 1, crc=5)}).replace
    # Source gone: the destination's own CRC stands (only this engine writes a fresh destination).
    assert plan_bid(1, 0, [None, {1: shard(1)}], {1: shard(1, crc=9)}) == BidMove(1, Action.DONE, SIZE, 9)
    assert plan_bid(1, 0, [None, {1: shard(1)}], {1: shard(1, size=1, crc=9)}).action is Action.REBUILD
    # Only the destination lists it and a unit cannot be listed: kept, never judged deleted on no evidence.
    assert plan_bid(1, 0, [None, None, {}], {1: shard(1, size=5, crc=9)}) == BidMove(1, Action.DONE, 5, 9)
    assert plan_bid(1, 0, [None, {}, {}], {1: shard(1)}).action is Action.LEFT  # every other unit lacks it


def test_every_combination_of_four_units_keeps_the_rules() -> None:
    kinds = [HAS, DEL, LACKS, DOWN]
    for combo in product(kinds, repeat=4):
        for held in (None, shard(1), shard(1, crc=CRC + 1)):
            units = [listing(k) for k in combo]
            destination = {} if held is None else {1: held}
            if not any(u is not None and 1 in u for u in units):
                assert plan_unit(0, units, destination) == []  # nobody lists it: not a candidate
                continue
            move = plan_bid(1, 0, units, destination)
            others = combo[1:]
            if DEL in combo or all(k == LACKS for k in others):
                assert move.action is Action.LEFT, combo
            elif held is not None and (held.crc == CRC or combo[0] != HAS):  # no source CRC: the held one stands
                assert move.action is Action.DONE and move.crc == held.crc, combo
            else:
                assert move.action is (Action.COPY if combo[0] == HAS else Action.REBUILD), combo
                assert move.sources == tuple(i for i, k in enumerate(combo) if i and k == HAS)
                assert move.replace == (held is not None)
                assert move.size == SIZE


def test_every_bid_any_unit_lists_is_planned_in_bid_order() -> None:
    units: list[Listing | None] = [None, {3: shard(3), 1: shard(1)}, {2: shard(2), 1: shard(1)}, {3: shard(3)}]
    assert [m.bid for m in plan_unit(0, units, {})] == [1, 2, 3]


def test_bids_written_after_the_plan_move_when_enough_other_units_hold_them() -> None:
    units: list[Listing | None] = [{1: shard(1), 2: shard(2), 3: shard(3), 4: shard(4)},
                                   {1: shard(1), 2: shard(2), 3: shard(3), 5: shard(5)},
                                   {1: shard(1), 3: shard(3), 4: shard(4, deleted=True), 5: shard(5)}, None]
    late = late_moves(0, units, {3: shard(3)}, planned={1}, data_shards=2)
    # 2: one other unit holds it (a PUT on its way, or failed); 3: the destination has it; 4: being deleted
    assert [(m.bid, m.action) for m in late] == [(5, Action.REBUILD)]
    assert late_moves(0, units, {}, planned={1}, data_shards=1)[0] == BidMove(2, Action.COPY, SIZE, CRC, sources=(1,))


def test_pieces_bound_the_bytes_in_flight_and_hold_only_writes() -> None:
    moves = [BidMove(b, Action.COPY if b % 3 else Action.DONE, size) for b, size in
             enumerate([10, 30, 50, 70, 10, 100, 5, 5])]
    groups = list(pieces(moves, 60))
    assert [[m.bid for m in g] for g in groups] == [[1], [2, 4], [5], [7]]
    assert all(sum(m.size for m in g) <= 60 or len(g) == 1 for g in groups)
    writes = [m for m in moves if m.action is Action.COPY]
    assert [m for g in groups for m in g] == writes


def test_rebuild_reads_only_what_it_needs_and_more_when_survivors_fail() -> None:
    codec = codec_for(parse_code_mode("EC6P3"))
    data = random.Random(3).randbytes(100_000)
    shards = [bytes(s) for s in codec.encode(data)]
    asked: list[int] = []
    broken = {1, 2}

    async def read(index: int) -> bytes | RpcError:
        asked.append(index)
        return Unavailable("down") if index in broken else shards[index]

    rebuilt = asyncio.run(rebuild_shards(codec, read, [1, 2, 3, 4, 5, 6, 7, 8], [0]))
    assert rebuilt == {0: shards[0]}
    assert isal_zlib.crc32(rebuilt[0]) == isal_zlib.crc32(shards[0])
    assert sorted(asked) == [1, 2, 3, 4, 5, 6, 7, 8]  # 6 first, then 2 more for the 2 that failed
    asked.clear()
    assert asyncio.run(rebuild_shards(codec, read, [3, 4, 5, 6, 7, 8], [0], have={3: shards[3]}))[0] == shards[0]
    assert sorted(asked) == [4, 5, 6, 7, 8]  # shard 3 was in hand

    broken = {1, 2, 3, 4}

    async def read_gone(index: int) -> bytes | RpcError:
        return ShardNotFound("gone") if index in broken else shards[index]

    with pytest.raises(RepairFailed, match="need 6") as gone:
        asyncio.run(rebuild_shards(codec, read_gone, [1, 2, 3, 4, 5, 6, 7, 8], [0]))
    assert gone.value.lost  # every failure says the shard is gone: retrying cannot help
    with pytest.raises(RepairFailed) as out_of_reach:
        asyncio.run(rebuild_shards(codec, read, [1, 2, 3, 4, 5, 6, 7], [0]))
    assert not out_of_reach.value.lost  # some were only unreachable: worth another try
