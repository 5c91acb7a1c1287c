"""clustermgr's check of a move's destination before a switch (services/clustermgr/moves.py): what it owes, which
lost claims excuse a gap, and that a worker's finished move (services/worker/migrate_plan.py) is never refused."""

from __future__ import annotations

import asyncio
import random
from itertools import product

from blobstore_server.libs.proto.blobnode import ShardInfo
from blobstore_server.services.clustermgr.moves import Page, Pages, missing, owed, unexcused, window_end
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


def test_a_window_ends_past_the_shortest_full_page() -> None:
    full, short = [shard(1), shard(5), shard(9)], [shard(2), shard(3)]
    assert window_end([full, short, None], 3) == 10
    assert window_end([full, [shard(2), shard(4), shard(6)]], 3) == 7
    assert window_end([short, [], None], 3) is None  # every list at its end


def test_lists_read_a_window_at_a_time_owe_what_whole_lists_owe() -> None:
    """Random volumes of six units (N = 3) and destinations, read in pages of 1 to 7 entries (a unit's list
    failing now and then): the bids found missing, split by the lost claims, are `owed` over the whole lists."""
    rng = random.Random(5)
    for _ in range(300):
        bids = sorted(rng.sample(range(1, 60), rng.randint(0, 40)))
        units: list[dict[int, ShardInfo]] = [
            {b: shard(b, deleted=rng.random() < 0.05) for b in bids if rng.random() < 0.8} for _ in range(6)]
        destination = {b: shard(b, size=SIZE if rng.random() < 0.9 else 1) for b in bids if rng.random() < 0.6}
        down = {i for i in range(1, 6) if rng.random() < 0.1}  # units that never answer
        lost = set(rng.sample(bids, min(len(bids), 5)))
        page_size = rng.randint(1, 7)

        whole = owed(0, [None if i in down else u for i, u in enumerate(units)], destination, N + 1)
        pages = paged([None if i in down else u for i, u in enumerate(units)], destination, page_size)
        unclaimed, claimed = asyncio.run(missing(pages, 0, lost, N + 1, page_size))
        assert (unclaimed, claimed) == ([b for b in whole if b not in lost], [b for b in whole if b in lost])


def paged(units: list[dict[int, ShardInfo] | None], destination: dict[int, ShardInfo], page_size: int) -> Pages:
    """The lists as blobnodes page them: `page_size` entries from a bid on, None for a unit that does not answer."""
    def page(listing: dict[int, ShardInfo], start: int) -> list[ShardInfo]:
        return [listing[b] for b in sorted(listing) if b >= start][:page_size]

    async def pages(start: int) -> tuple[list[Page | None], Page]:
        return [None if u is None else page(u, start) for u in units], page(destination, start)

    return pages
