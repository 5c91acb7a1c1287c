"""A disk's `.trash/`: what it holds and when each file goes, free of I/O (services/blobnode/upkeep.py removes them).

A chunk file lands there when its chunk is released (its unit moved to another disk: repair, drop, balance,
migration; or a volume's creation rolled back) or compacted away (its live shards copied into a new file). It
stays `trash_hold` seconds after the move, so that an operator's mistake (a wrong drop, a bad migration) can still
be undone from the file (docs/operations.md "Trash"), then it is removed as background I/O of the disk, cut `step`
bytes at a time from its end so that no single call frees a whole large file at once.

A file's name says what it was and when it came: `<chunk id>.<why>.<unix milliseconds>`. A file named otherwise
(moved there by a blobnode older than these names, or by hand) counts from its ctime, which the rename into
`.trash/` set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

TRASH_DIR = ".trash"


class TrashReason(StrEnum):
    RELEASED = "released"  # the unit moved away, or the volume was never created
    COMPACTED = "compacted"  # superseded by its compacted copy


REASONS = frozenset(reason.value for reason in TrashReason)

@dataclass(frozen=True)
class TrashEntry:
    """One file in `.trash/`."""

    name: str
    chunk_id: str
    why: str  # a TrashReason, or "" for a file named otherwise
    moved_at: float  # unix time it was moved there
    size: int  # its length (st_size), which the purge cuts down
    disk_bytes: int  # what it occupies (st_blocks * 512): a chunk file has holes where shards were deleted

    def due(self, hold: float, now: float) -> bool:
        return now >= self.moved_at + hold


def trash_name(chunk_id: str, why: TrashReason, moved_at: float) -> str:
    """The millisecond is rounded up: the hold never ends early."""
    return f"{chunk_id}.{why.value}.{math.ceil(moved_at * 1000)}"


def trash_entry(name: str, size: int, disk_bytes: int, changed: float) -> TrashEntry:
    """The entry of the file `name`; `changed`: its ctime, the moment it came for a name that does not say."""
    chunk_id, _, rest = name.partition(".")
    why, _, millis = rest.partition(".")
    if why in REASONS and millis.isdigit():
        return TrashEntry(name, chunk_id, why, int(millis) / 1000, size, disk_bytes)
    return TrashEntry(name, name, "", changed, size, disk_bytes)


def due(entries: Iterable[TrashEntry], hold: float, now: float) -> list[TrashEntry]:
    """The entries whose hold is over, oldest first."""
    return sorted((e for e in entries if e.due(hold, now)), key=lambda e: (e.moved_at, e.name))


def next_cut(size: int, step: int) -> int:
    """The length to cut a file of `size` bytes down to next; 0: remove it."""
    return max(0, size - step)
