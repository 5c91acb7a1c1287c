"""Where a volume's units go: spread over AZs per the code mode, then hosts, then racks.

Pure and deterministic given its inputs (after Apache BookKeeper's rack/region-aware ensemble
placement, and replacing one member while keeping the spread). Unit i of a mode with A AZs lives in
AZ `tactic.unit_az(i)`: each AZ holds N/A data, M/A parity and L/A local-parity units, so losing a
whole AZ loses at most what the code can rebuild. Inside an AZ no host gets a second unit while
another host has none, so losing one host costs a volume one unit whenever the AZ has enough hosts;
with too few, the units spread as evenly as the hosts' disks allow and the volume is under-spread.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from blobstore_server.libs.ec import Tactic
from blobstore_server.libs.proto.cluster import DiskInfo


class PlacementError(Exception):
    """Not enough suitable disks for the placement asked for."""


@dataclass(frozen=True)
class Candidate:
    """A disk that may take a unit: healthy, writable, and with room for another chunk."""

    disk_id: int
    host: str  # the machine (DiskInfo.machine): placement spreads over these
    idc: str
    rack: str
    free: int
    chunks: int = 0  # chunks it holds already: the load placement evens out
    url: str = ""  # its blobnode's


def as_candidate(disk: DiskInfo) -> Candidate:
    return Candidate(disk.disk_id, disk.machine, disk.idc, disk.rack, disk.free, disk.chunks, disk.host)


def candidates(disks: Iterable[DiskInfo], now: float, heartbeat_timeout: float, *,
               reserve: int = 0) -> list[Candidate]:
    """Disks that may take a new chunk: writable, heard from recently, and with more than `reserve`
    chunk slots left (volume creation keeps the last ones for repair, CubeFS #3937)."""
    return [as_candidate(d) for d in disks
            if d.writable and d.heard_from(now, heartbeat_timeout) and d.chunks + reserve < d.max_chunks]


def shares_a_host(hosts: Iterable[str]) -> bool:
    """Whether two units sit on one host: the mark of an under-spread volume."""
    seen = list(hosts)
    return len(set(seen)) < len(seen)


def _pick(pool: Sequence[Candidate], taken: Iterable[Candidate], count: int, rng: random.Random) -> list[Candidate]:
    """Choose `count` disks from `pool`, each time the one whose host, then rack, holds the fewest
    units so far, then the one on the host with the fewest chunks per disk, then the disk with the fewest
    chunks, then the most free space; never a disk already taken. Taking the emptiest host every time
    gives the smallest possible largest share of any host; the chunk counts spread a burst of new
    volumes over every host (free space alone is equal on disks that share a filesystem, and would
    send them all to the same hosts). Per disk, not in all: a host whose broken disk is out of the pool
    is no emptier for it, or every unit of that disk would move to its sibling disks."""
    taken = list(taken)
    racks = Counter(c.rack for c in taken)
    hosts = Counter(c.host for c in taken)
    chunks: Counter[str] = Counter()
    disks: Counter[str] = Counter()
    for c in pool:
        chunks[c.host] += c.chunks
        disks[c.host] += 1
    load = {host: chunks[host] / disks[host] for host in disks}
    used = {c.disk_id for c in taken}
    chosen: list[Candidate] = []
    for _ in range(count):
        options = [c for c in pool if c.disk_id not in used]
        if not options:
            raise PlacementError(f"needs {count} disks here but only {len(chosen)} are free to take")
        rng.shuffle(options)  # ties break randomly, so equal disks share the load
        best = min(options, key=lambda c: (hosts[c.host], racks[c.rack], load[c.host], c.chunks, -c.free))
        chosen.append(best)
        used.add(best.disk_id)
        racks[best.rack] += 1
        hosts[best.host] += 1
    return chosen


def _az_order(candidates: Sequence[Candidate], az_count: int, idcs: Sequence[str] | None) -> list[str]:
    present = sorted({c.idc for c in candidates})
    order = [idc for idc in (idcs or present) if idc in present]
    if len(order) < az_count:
        raise PlacementError(f"the code mode needs {az_count} AZs; only {len(order)} have usable disks: {order}")
    if idcs is None and az_count == 1:
        # A single-AZ mode goes to the AZ with the most free space.
        order.sort(key=lambda idc: -sum(c.free for c in candidates if c.idc == idc))
    return order[:az_count]


def place_volume(tactic: Tactic, candidates: Sequence[Candidate], *, idcs: Sequence[str] | None = None,
                 rng: random.Random | None = None) -> list[Candidate]:
    """One disk per unit, in unit order."""
    rng = rng or random.Random()
    azs = _az_order(candidates, tactic.az_count, idcs)
    slots: dict[int, list[int]] = {}
    for index in range(tactic.total):
        slots.setdefault(tactic.unit_az(index), []).append(index)
    placed: dict[int, Candidate] = {}
    for slot, indexes in slots.items():
        pool = [c for c in candidates if c.idc == azs[slot]]
        try:
            chosen = _pick(pool, (), len(indexes), rng)
        except PlacementError as exc:
            raise PlacementError(f"AZ {azs[slot]!r}: {exc}") from None
        placed.update(zip(indexes, chosen, strict=True))
    return [placed[i] for i in range(tactic.total)]


def replace_unit(tactic: Tactic, current: Sequence[Candidate], index: int, candidates: Sequence[Candidate],
                 *, rng: random.Random | None = None) -> Candidate:
    """A new disk for unit `index` in the same AZ as the rest of its AZ slot, spread away from the
    volume's other units there, and never a disk the volume already uses (the old one included)."""
    slot = tactic.unit_az(index)
    peers = [c for i, c in enumerate(current) if i != index and tactic.unit_az(i) == slot]
    idc = peers[0].idc if peers else current[index].idc
    used = {c.disk_id for c in current}
    pool = [c for c in candidates if c.idc == idc and c.disk_id not in used]
    try:
        return _pick(pool, peers, 1, rng or random.Random())[0]
    except PlacementError:
        raise PlacementError(f"no disk in AZ {idc!r} can take unit {index}") from None


def replacement_disk(tactic: Tactic, unit_disks: Sequence[DiskInfo], index: int, disks: Iterable[DiskInfo],
                     now: float, heartbeat_timeout: float, *, rng: random.Random | None = None) -> int:
    """The disk a volume's unit `index` moves to: `replace_unit` over the disks that may take a chunk now.
    `unit_disks` are the disks of the volume's units, in unit order."""
    if not 0 <= index < len(unit_disks):
        raise PlacementError(f"the volume has no unit {index}")
    current = [as_candidate(d) for d in unit_disks]
    return replace_unit(tactic, current, index, candidates(disks, now, heartbeat_timeout), rng=rng).disk_id


def check_placement(tactic: Tactic, disks: Sequence[Candidate]) -> None:
    """Refuse a placement that breaks the rules (used on every volume commit)."""
    if len(disks) != tactic.total:
        raise PlacementError(f"needs {tactic.total} units, got {len(disks)}")
    ids = [d.disk_id for d in disks]
    if len(set(ids)) != len(ids):
        dup = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise PlacementError(f"two units on one disk: disk(s) {dup}")
    by_slot: dict[int, set[str]] = {}
    for index, disk in enumerate(disks):
        by_slot.setdefault(tactic.unit_az(index), set()).add(disk.idc)
    idcs = [next(iter(v)) if len(v) == 1 else None for v in by_slot.values()]
    if None in idcs or len(set(idcs)) != tactic.az_count:
        raise PlacementError(f"the code mode needs its units in {tactic.az_count} distinct AZs, one per AZ slot")
