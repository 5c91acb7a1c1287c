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
from collections.abc import Collection, Mapping, Sequence

from blobstore_server.libs.proto.blobnode import ShardInfo

NORMAL = "normal"
Listing = Mapping[int, ShardInfo]  # bid -> a unit's index entry


def owed(index: int, units: Sequence[Listing | None], destination: Listing, data_shards: int) -> list[int]:
    """The bids, in order, the destination of unit `index` lacks (or holds deleted, or at another size than the
    unit's shards) of the blobs it owes. `units`: every unit's list, the moved one's too (None where it could not
    be read)."""
    missing = []
    for bid in sorted({bid for listing in units if listing is not None for bid in listing}):
        entries = {i: listing[bid] for i, listing in enumerate(units) if listing is not None and bid in listing}
        held = destination.get(bid)
        if any(e.status != NORMAL for e in entries.values()) or (held is not None and held.status != NORMAL):
            continue
        others = [e.size for i, e in entries.items() if i != index]
        if len(others) < data_shards:
            continue
        size = entries[index].size if index in entries else Counter(others).most_common(1)[0][0]
        if held is None or held.size != size:
            missing.append(bid)
    return missing


def unexcused(missing: Sequence[int], lost: Collection[int], good_shards: Mapping[int, int],
              data_shards: int) -> list[int]:
    """The missing bids the move's lost claims do not excuse: not claimed, or claimed while `good_shards` (bid ->
    shards clustermgr read back intact from the volume's other units) shows the blob could have been rebuilt."""
    return [bid for bid in missing if bid not in lost or good_shards.get(bid, 0) >= data_shards]
