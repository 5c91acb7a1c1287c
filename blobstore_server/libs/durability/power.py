"""A one-shot power event: a fraction f of the disks never comes back (Copysets: 0.5-1% of nodes after a
cluster-wide power loss), and whether any volume loses more than it can rebuild.

Dead disks are either scattered (each disk dies with f) or clustered by rack (each rack is hit with f / s,
and a share s of a hit rack's disks dies: a PDU or a row of racks). A volume's loss probability depends only
on how its units share racks, so it is computed exactly for each sampled placement's rack pattern, then
E = V * mean and P(any) = 1 - e^-E (volumes are placed independently, so losses are nearly Poisson).
Placement is the project's rack-aware rule (`layout.sample`) or the strawman "any distinct disks".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blobstore_server.libs.durability import layout
from blobstore_server.libs.ec import Tactic


@dataclass(frozen=True)
class PowerEvent:
    fraction: float
    scattered_p_any: float  # any placement: units on distinct disks die independently
    clustered_random_p_any: float
    clustered_rack_aware_p_any: float
    scattered_expected: float  # volumes lost
    clustered_random_expected: float
    clustered_rack_aware_expected: float


def _binomial(trials: int, p: float) -> np.ndarray:
    return np.array([math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(trials + 1)])


def loss_probability(groups: list[int], tolerance: int, rack_hit: float, disk_dies: float) -> float:
    """P(more than `tolerance` units die) for a volume whose units fill racks as `groups` (units per rack)."""
    dead = np.array([1.0])
    for size in groups:
        per_rack = rack_hit * _binomial(size, disk_dies)
        per_rack[0] += 1 - rack_hit
        dead = np.convolve(dead, per_rack)
    return float(dead[tolerance + 1:].sum())


def rack_patterns(tactic: Tactic, topo: layout.Topology, samples: int, rng: np.random.Generator,
                  rack_aware: bool) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rack-sharing patterns of sampled volumes (units per rack, largest first) and their counts."""
    placed = layout.sample(tactic, topo, samples, rng, rack_aware=rack_aware)[:, :tactic.global_count]
    racks = np.sort(topo.rack_of(placed), axis=1)
    starts = np.ones(racks.shape, dtype=bool)
    starts[:, 1:] = racks[:, 1:] != racks[:, :-1]
    group = np.cumsum(starts, axis=1) - 1
    sizes = np.zeros(racks.shape, dtype=np.int64)
    np.add.at(sizes, (np.arange(samples)[:, None], group), 1)
    patterns, counts = np.unique(-np.sort(-sizes, axis=1), axis=0, return_counts=True)
    return patterns, counts


def power_event(tactic: Tactic, topo: layout.Topology, volumes: float, fraction: float, rack_share: float,
                rng: np.random.Generator, samples: int = 20_000) -> PowerEvent:
    tolerance = tactic.m
    scattered = volumes * loss_probability([1] * tactic.global_count, tolerance, fraction, 1.0)
    clustered = []
    for rack_aware in (False, True):
        patterns, counts = rack_patterns(tactic, topo, samples, rng, rack_aware)
        p = sum(int(n) * loss_probability([int(g) for g in row if g], tolerance, fraction / rack_share, rack_share)
                for row, n in zip(patterns, counts, strict=True)) / samples
        clustered.append(volumes * p)
    return PowerEvent(fraction, -math.expm1(-scattered), -math.expm1(-clustered[0]), -math.expm1(-clustered[1]),
                      scattered, clustered[0], clustered[1])
