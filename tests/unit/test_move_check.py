"""clustermgr's check of a move's destination before a switch (services/clustermgr/moves.py): what it owes, which
lost claims excuse a gap, and that a worker's finished move (services/worker/migrate_plan.py) is never refused."""

from __future__ import annotations

from itertools import product

from blobstore_server.libs.proto.blobnode import ShardInfo
from blobstore_server.services.clustermgr.moves import owed, unexcused
from blobstore_server.services.worker.migrate_plan import Action, Listing, plan_unit

SIZE = 4096
N = 2  # data shards of the four-unit volumes below


def shard(bid: int, size: int = SIZE, deleted: bool = False) -> ShardInfo:
    return ShardInfo(bid=bid, vuid=1, offset=0, size=size, crc=7, status="mark_deleted" if deleted else "normal")


def listing(*shards: ShardInfo) -> dict[int, ShardInfo]:
    return {s.bid: s for s in shards}


def test_the_destination_owes_blobs_n_other_units_hold_and_none_deletes() -> None:
    units: list[Listing | None] = [
        listing(shard(1), shard(2), shard(3)),  # unit 0, the one moved
        listing(shard(1), shard(2), shard(3, deleted=True), shard(4), shard(5)),
        listing(shard(1), shard(2), shard(3), shard(4)),
        listing(shard(1), shard(5)),
    ]
    # 1 and 2: on three other units; 3: deleted on one; 4: on two (N); 5: on two; every one lacking
    assert owed(0, units, {}, N) == [1, 2, 4, 5]
    # the moved unit does not count towards N: a blob on it and one other unit is not owed
    assert owed(0, [listing(shard(6)), listing(shard(6)), None, None], {}, N) == []
    done = listing(shard(1), shard(2), shard(4), shard(5))
    assert owed(0, units, done, N) == []
    # held deleted (a delete reached the destination first) is not owed; held at another size is as good as absent
    assert owed(0, units, listing(shard(1), shard(2, size=1), shard(4, deleted=True), shard(5)), N) == [2]
    # the size owed is the moved unit's own when it listed the shard, else the one most other units hold
    sized = [listing(shard(7, size=10)), listing(shard(7, size=10)), listing(shard(7, size=11)),
             listing(shard(7, size=11))]
    assert owed(0, sized, listing(shard(7, size=11)), N) == [7]
    assert owed(0, [None, *sized[1:]], listing(shard(7, size=11)), N) == []


def test_a_lost_claim_excuses_only_a_blob_too_few_good_shards_are_left_of() -> None:
    missing = [1, 2, 3]
    assert unexcused(missing, [], {}, N) == [1, 2, 3]
    assert unexcused(missing, [1, 2, 3], {1: 1, 2: 2, 3: 0}, N) == [2]  # 2 could have been rebuilt
    assert unexcused(missing, [3, 9], {3: 1}, N) == [1, 2]  # a claim of a bid not missing changes nothing


def test_a_move_the_worker_finished_is_never_refused() -> None:
    """Every volume of four units (N = 2) whose units each list a bid as absent, normal, deleted, or cannot be
    listed (the moved unit's source too): the destination as the worker's plan leaves it owes nothing, and an
    empty one owes exactly the bids at least N other units hold while none deletes them."""
    states = ("absent", "normal", "deleted", "unlisted")
    cases = 0
    for combo in product(states, repeat=4):
        units: list[Listing | None] = [
            None if s == "unlisted" else listing(*([shard(1, deleted=s == "deleted")] if s != "absent" else []))
            for s in combo]
        finished = {m.bid: shard(m.bid, m.size) for m in plan_unit(0, units, {}) if m.action is not Action.LEFT}
        assert owed(0, units, finished, N) == [], combo
        others = combo[1:]
        expected = [1] if others.count("normal") >= N and "deleted" not in combo else []
        assert owed(0, units, {}, N) == expected, combo
        cases += 1
    assert cases == 4 ** 4
