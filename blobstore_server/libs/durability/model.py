"""Analytic durability: an absorbing Markov chain over the failed units of one volume.

State i = units of a volume lost and not yet rebuilt (0..m); state m+1 (data lost) absorbs. A unit fails at
`unit_afr` per year (disk AFR plus host AFR: placement puts one unit per host), so state i leaves upwards at
(width - i) * lam; its i lost units are rebuilt in parallel, each in a mean `exposure(i)`, so it leaves
downwards at i / exposure(i). Exposure is detection plus half a whole-disk rebuild (a lost unit sits at a
uniformly random place in its disk's rebuild queue), or, with margin priority, detection plus
`priority_s` once the volume is at margin <= `urgent_margin` (the scheduler's urgent lane, rules.py).

The mean time to data loss comes from the first-passage recursion tau_k = (1 + d_k tau_(k-1)) / b_k, exact
for a birth-death chain and made of positive terms only: a dense `numpy.linalg.solve` of the same chain loses
every digit once the answer passes ~1e16 years (EC6P6, LRC), see the tests. Loss is then a Poisson process:
p_vol = 1 - exp(-1 / MTTDL) per year and volume (per-object durability), E = V * p_vol volumes a year, and
P(any volume lost in a year) = 1 - exp(-E) (cluster-wide durability, about V = 10^6 times worse).
LRC modes count only their N + M global units and tolerate M losses: local parity speeds repair but is not
credited with saving data (conservative).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from blobstore_server.libs.ec import CodeMode, tactic

SECONDS_PER_YEAR = 365.0 * 86_400.0
GIB = 1 << 30
# Modes reported unless asked otherwise: the RS modes in use, and LRC modes (EC6P3L3 the LRC twin of EC6P3).
DEFAULT_MODES: tuple[CodeMode, ...] = (CodeMode.EC3P3, CodeMode.EC6P3, CodeMode.EC10P4, CodeMode.EC12P4,
                                       CodeMode.EC6P6, CodeMode.EC6P3L3, CodeMode.EC6P10L2)
# Last rebuild rate measured by bench/repair.py (MB/s rebuilt per failed disk) when its JSON has none.
MEASURED_REBUILD_MB_S = 31.0
ELEVEN_NINES = 1e-11
CLUSTER_TARGET = 1e-6
RATE_FLOOR_MB_S = 0.01  # the rate search starts here: "<= floor" means any plausible rate meets the target
RATE_CEILING_MB_S = 1e6  # and stops here: above it the target is out of reach (detection alone breaks it)


@dataclass(frozen=True)
class CodeShape:
    """What durability sees of a code mode: units per volume, the units that count, losses survived."""

    name: str
    units: int  # every unit of a volume (N + M + L): how many volumes a disk holds
    width: int  # units whose loss counts towards data loss (N + M)
    tolerance: int  # losses survived (M)
    data: int  # N: bytes read per rebuilt byte (RS decode)

    @classmethod
    def of(cls, mode: CodeMode) -> CodeShape:
        t = tactic(mode)
        return cls(mode.name, t.total, t.global_count, t.m, t.n)


@dataclass(frozen=True)
class ClusterParams:
    """Inputs of the model; defaults are the research note's worked example (10k x 16 TB, 80% full, 1% AFR)."""

    disks: int = 10_000
    hosts: int = 500
    disk_tb: float = 16.0  # decimal TB, as drives are sold
    fill: float = 0.8
    chunk_gib: float = 16.0
    disk_afr: float = 0.01  # Backblaze Drive Stats 2024 ran 1.4-1.6%; 1% is the note's baseline (stress: 2%)
    host_afr: float = 0.0  # hosts lost for good with their disks (transient outages are ridden out)
    detect_s: float = 600.0  # disk_broken_after
    rebuild_mb_s: float = MEASURED_REBUILD_MB_S  # MB/s rebuilt per failed disk
    margin_priority: bool = True
    priority_s: float = 1_200.0  # an urgent volume is rebuilt this long after detection
    urgent_margin: int = 1  # services/scheduler/rules.URGENT_MARGIN

    @property
    def units_per_disk(self) -> int:
        return int(self.disk_tb * 1e12 * self.fill // (self.chunk_gib * GIB))

    @property
    def rebuild_bytes(self) -> float:
        """Bytes to rebuild when a disk is lost: its used chunks."""
        return self.units_per_disk * self.chunk_gib * GIB

    @property
    def unit_afr(self) -> float:
        return self.disk_afr + self.host_afr

    @property
    def rebuild_s(self) -> float:
        return self.rebuild_bytes / (self.rebuild_mb_s * 1e6)

    def exposure_s(self, lost: int, tolerance: int) -> float:
        """Mean seconds a lost unit waits for its rebuild while its volume has `lost` units lost."""
        normal = self.detect_s + self.rebuild_s / 2
        if self.margin_priority and tolerance - lost <= self.urgent_margin:
            return min(normal, self.detect_s + self.priority_s)
        return normal


@dataclass(frozen=True)
class ModeDurability:
    """One code mode's annual loss figures at one rebuild rate."""

    mode: str
    width: int
    tolerance: int
    volumes: float
    rebuild_hours: float
    p_object: float  # annual loss probability of one volume (per-object durability)
    expected_losses: float  # volumes lost per year, cluster-wide
    p_any: float  # P(at least one volume lost in a year)

    @property
    def object_nines(self) -> float:
        return nines(self.p_object)

    @property
    def cluster_nines(self) -> float:
        return nines(self.p_any)


def nines(p: float) -> float:
    return math.inf if p <= 0 else -math.log10(p)


def mean_time_to_loss(width: int, tolerance: int, lam: float, exposures: list[float]) -> float:
    """Expected years from no lost unit to more than `tolerance` lost (`exposures[i-1]`: years at level i)."""
    tau = total = 0.0  # tau: mean years from `lost` to `lost` + 1
    for lost in range(tolerance + 1):
        up = (width - lost) * lam
        down = lost / exposures[lost - 1] if lost else 0.0
        tau = (1.0 + down * tau) / up
        total += tau
    return total


def volumes(params: ClusterParams, shape: CodeShape) -> float:
    return params.disks * params.units_per_disk / shape.units


def evaluate(params: ClusterParams, shape: CodeShape) -> ModeDurability:
    """Annual loss of one volume and of the cluster for one code mode."""
    if params.hosts < shape.units:
        # One unit per host is what makes a unit's failures independent of its neighbours'.
        raise ValueError(f"{shape.name} needs {shape.units} hosts for one unit per host, there are {params.hosts}")
    exposures = [params.exposure_s(i, shape.tolerance) / SECONDS_PER_YEAR for i in range(1, shape.tolerance + 1)]
    mttdl = mean_time_to_loss(shape.width, shape.tolerance, params.unit_afr, exposures)
    p_object = -math.expm1(-1.0 / mttdl)
    count = volumes(params, shape)
    expected = count * p_object
    return ModeDurability(shape.name, shape.width, shape.tolerance, count, params.rebuild_s / 3600, p_object,
                          expected, -math.expm1(-expected))


def required_rate(params: ClusterParams, shape: CodeShape, meets: Callable[[ModeDurability], bool]) -> float | None:
    """The lowest rebuild MB/s per failed disk at which `meets` holds, by bisection on log(rate) (loss falls as
    the rate rises); RATE_FLOOR_MB_S if even that meets it, None if no rate up to RATE_CEILING_MB_S does."""

    def ok(rate: float) -> bool:
        return meets(evaluate(replace(params, rebuild_mb_s=rate), shape))

    if ok(RATE_FLOOR_MB_S):
        return RATE_FLOOR_MB_S
    if not ok(RATE_CEILING_MB_S):
        return None
    low, high = math.log(RATE_FLOOR_MB_S), math.log(RATE_CEILING_MB_S)
    for _ in range(60):
        middle = (low + high) / 2
        if ok(math.exp(middle)):
            high = middle
        else:
            low = middle
    return math.exp(high)


@dataclass(frozen=True)
class ModeReport:
    """A mode's figures at the given rate and the rates its two targets need."""

    durability: ModeDurability
    rate_for_object_11_nines: float | None
    rate_for_cluster_1e6: float | None
    rate_for_cluster_1e6_without_priority: float | None


def report(params: ClusterParams, modes: tuple[CodeMode, ...] = DEFAULT_MODES) -> list[ModeReport]:
    rows = []
    for mode in modes:
        shape = CodeShape.of(mode)
        rows.append(ModeReport(
            evaluate(params, shape),
            required_rate(params, shape, lambda d: d.p_object < ELEVEN_NINES),
            required_rate(params, shape, lambda d: d.p_any < CLUSTER_TARGET),
            required_rate(replace(params, margin_priority=False), shape, lambda d: d.p_any < CLUSTER_TARGET),
        ))
    return rows
