"""Whether a move's destination holds what the unit it replaces must, decided before the switch is committed: a
scheduler's key alone can then not point a volume's unit at a chunk it left empty (docs/security.md, Tickets).

The units' shard lists say which blobs the destination owes: each listed as normal by at least N of the volume's
other units (acknowledged, and rebuildable without the unit moved: a worker can always bring it; fewer is a PUT that
failed or is still on its way, which the unit need not carry) and marked deleted by none (a migration leaves those
behind). A blob the worker could not rebuild (its shards fail their checksums on too many units) is owed all the
same unless the move names it lost and clustermgr, reading its shards on the other units itself, finds fewer than N
of them good."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

from blobstore_server.libs.proto.blobnode import ShardInfo

NORMAL = "normal"
Listing = Mapping[int, ShardInfo]  # bid -> a unit's index entry
Page = Sequence[ShardInfo]  # a unit's next entries from some bid, in bid order
# A start bid -> each unit's page from there (None: it did not answer), and the destination's
Pages = Callable[[int], Awaitable[tuple[Sequence[Page | None], Page]]]


def owed(index: int, units: Sequence[Listing | None], destination: Listing, data_shards: int) -> list[int]:
    """The bids, in order, the destination of unit `index` lacks (or holds deleted, or at another size than the
    unit's shards) of the blobs it owes. `units`: every unit's list, the moved one's too (None where it could not
    be read). One pass over each list: a unit of millions of bids is checked in seconds."""
    deleted = {bid for bid, held in destination.items() if held.status != NORMAL}
    others: dict[int, list[int]] = {}  # bid -> the sizes other units list it normal at
    own: dict[int, int] = {}
    for i, listing in enumerate(units):
        if listing is None:
            continue
        for bid, entry in listing.items():
            if entry.status != NORMAL:
                deleted.add(bid)
            elif i == index:
                own[bid] = entry.size
            else:
                others.setdefault(bid, []).append(entry.size)
    missing = []
    for bid in sorted(others):
        sizes = others[bid]
        if bid in deleted or len(sizes) < data_shards:
            continue
        size = own.get(bid)
        if size is None:
            size = sizes[0] if min(sizes) == max(sizes) else Counter(sizes).most_common(1)[0][0]
        held = destination.get(bid)
        if held is None or held.size != size:
            missing.append(bid)
    return missing


def unexcused(missing: Sequence[int], lost: Collection[int], good_shards: Mapping[int, int],
              data_shards: int) -> list[int]:
    """The missing bids the move's lost claims do not excuse: not claimed, or claimed while `good_shards` (bid ->
    shards clustermgr read back intact from the volume's other units) shows the blob could have been rebuilt."""
    return [bid for bid in missing if bid not in lost or good_shards.get(bid, 0) >= data_shards]


def window_end(pages: Sequence[Sequence[ShardInfo] | None], page_size: int) -> int | None:
    """Where one round of paged lists (each unit's next `page_size` entries from the same bid, in bid order) stops
    covering every unit: past the last bid of the shortest full page. None when no page came back full (every list
    reached its end), so the round covers everything left."""
    return min((page[-1].bid + 1 for page in pages if page is not None and len(page) >= page_size), default=None)


async def missing(pages: Pages, index: int, lost: Collection[int], data_shards: int, page_size: int
                  ) -> tuple[list[int], list[int]]:
    """`owed` over lists read a window at a time (`pages` gives each round, `page_size` entries a list): the owed
    bids the destination lacks, as (not named in `lost`, named)."""
    unclaimed: list[int] = []
    claimed: list[int] = []
    start = 0
    while True:
        units, held = await pages(start)
        end = window_end([*units, held], page_size)
        windows = [None if page is None else _cut(page, end) for page in units]
        for bid in owed(index, windows, _cut(held, end), data_shards):
            (claimed if bid in lost else unclaimed).append(bid)
        if end is None:
            return unclaimed, claimed
        start = end


def _cut(page: Page, end: int | None) -> dict[int, ShardInfo]:
    return {s.bid: s for s in page if end is None or s.bid < end}
