"""A simulated cluster's shape and a vectorized twin of `libs.placement.place_volume`.

The simulation needs the units of 10^5-10^7 volumes over 120,000 disks; `place_volume` scans the whole pool
for every unit (O(pool) each), so it would take days. On a cluster whose racks are all alike and whose disks
all hold as many chunks, `place_volume` is symmetric: every choice it makes is "the host, then the rack,
holding the fewest of this volume's units", ties broken at random. For one AZ slot of c units over R racks
of H hosts that is: c distinct racks chosen uniformly when R >= c, else every rack gets c // R units and
c % R random racks one more; distinct hosts inside a rack; any disk of a host. `sample` draws exactly that
for many volumes at once, and tests/unit/test_durability.py checks it against `place_volume` on small
clusters (one unit per host, the same rack occupancy, disks used evenly). What it leaves out is
`place_volume`'s load evening between successive volumes (fewest chunks first): volumes here are drawn
independently, so a disk holds its share of units on average rather than exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blobstore_server.libs.ec import Tactic


@dataclass(frozen=True)
class Topology:
    """AZs of equal racks of equal hosts of equal disks; disk ids run AZ by AZ, rack by rack, host by host."""

    az_count: int
    racks_per_az: int
    hosts_per_rack: int
    disks_per_host: int

    @classmethod
    def build(cls, nodes: int, disks_per_host: int, hosts_per_rack: int, az_count: int) -> Topology:
        """The largest alike layout that fits `nodes` hosts (a few left over when they do not divide)."""
        per_az = nodes // az_count
        if per_az < 1:
            raise ValueError(f"{nodes} hosts cannot fill {az_count} AZs")
        racks = max(1, per_az // hosts_per_rack)
        return cls(az_count, racks, min(hosts_per_rack, per_az), disks_per_host)

    @property
    def racks(self) -> int:
        return self.az_count * self.racks_per_az

    @property
    def hosts(self) -> int:
        return self.racks * self.hosts_per_rack

    @property
    def disks(self) -> int:
        return self.hosts * self.disks_per_host

    @property
    def disks_per_rack(self) -> int:
        return self.hosts_per_rack * self.disks_per_host

    def rack_of(self, disk: np.ndarray) -> np.ndarray:
        return disk // self.disks_per_rack

    def host_of(self, disk: np.ndarray) -> np.ndarray:
        return disk // self.disks_per_host


def _distinct(count: int, choose: int, of: int, rng: np.random.Generator) -> np.ndarray:
    """`count` rows of `choose` distinct integers below `of`, each row uniform."""
    if choose * choose <= of:  # few clashes: draw with replacement, redraw the rows that clash
        rows = rng.integers(0, of, size=(count, choose))
        while True:
            ordered = np.sort(rows, axis=1)
            clash = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
            if not clash.any():
                return rows
            rows[clash] = rng.integers(0, of, size=(int(clash.sum()), choose))
    return np.argsort(rng.random((count, of)), axis=1)[:, :choose]


def _slot_rack_aware(topo: Topology, az: int, count: int, units: int, rng: np.random.Generator) -> np.ndarray:
    """Hosts (ids within the AZ) for `units` units of `count` volumes: fewest per host, then per rack."""
    racks, per_rack = topo.racks_per_az, topo.hosts_per_rack
    if units > racks * per_rack:
        raise ValueError(f"an AZ slot of {units} units needs {units} hosts, AZ {az} has {racks * per_rack}")
    if racks >= units:
        rack = _distinct(count, units, racks, rng)
        return rack * per_rack + rng.integers(0, per_rack, size=(count, units))
    # Round robin: every rack's first host (racks in random order), then every rack's second, and so on.
    host_rank = np.argsort(np.argsort(rng.random((count, racks, per_rack)), axis=2), axis=2)
    rack_rank = np.argsort(np.argsort(rng.random((count, racks)), axis=1), axis=1)
    key = (host_rank * racks + rack_rank[:, :, None]).reshape(count, racks * per_rack)
    return np.argsort(key, axis=1)[:, :units]


def sample(tactic: Tactic, topo: Topology, count: int, rng: np.random.Generator, *,
           rack_aware: bool = True) -> np.ndarray:
    """Disk ids of `count` volumes, one row each in unit order: unit i in AZ `tactic.unit_az(i)` (AZ slot j is
    AZ j: the layout has as many AZs as the mode, as `place_volume` takes the first ones). With
    `rack_aware=False` the units go to any distinct disks of their AZ: the strawman placement."""
    if topo.az_count != tactic.az_count:
        raise ValueError(f"the layout has {topo.az_count} AZs, the mode wants {tactic.az_count}")
    slots = np.array([tactic.unit_az(i) for i in range(tactic.total)])
    placed = np.empty((count, tactic.total), dtype=np.int64)
    disks_per_az = topo.racks_per_az * topo.disks_per_rack
    for az in range(tactic.az_count):
        columns = np.flatnonzero(slots == az)
        if rack_aware:
            hosts = _slot_rack_aware(topo, az, count, len(columns), rng)
            disks = hosts * topo.disks_per_host + rng.integers(0, topo.disks_per_host, size=hosts.shape)
        else:
            disks = _distinct(count, len(columns), disks_per_az, rng)
        placed[:, columns] = az * disks_per_az + disks
    return placed
