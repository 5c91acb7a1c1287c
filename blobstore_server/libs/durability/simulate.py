"""Discrete-event simulation of disk, host and rack failures and their repair, free of I/O.

What is simulated, per code mode, on its own cluster of `nodes` hosts (as many AZs as the mode spans,
racks of `hosts_per_rack`, see `layout.py` for how volumes are placed by the project's rules):
- failures: disks (`disk_afr`), whole hosts (`host_afr`, all their disks, lost for good) and, with
  `rack_failures`, rack events (`rack_afr`; each disk of the rack stays dead with `rack_disk_loss`);
  exponential lifetimes; a rebuilt disk's units count as back on a new disk in its slot (placement stays
  fixed: with independent failures a healthy volume's future depends only on its units being on distinct
  hosts and racks, which a fresh spread would give too);
- repair: a dead disk is noticed `detect_s` later, then rebuilt as a fluid: every noticed disk drains its
  used bytes at min(`disk_repair_mb_s`, `max_tasks` x `task_mb_s` / disks being rebuilt), units in random
  order (the scheduler's per-disk cap and its concurrency cap); with `margin_priority` a volume at margin
  <= `urgent_margin` has its lost units rebuilt `priority_s` after their detection, past both caps (the
  scheduler's urgent lane); `fixed_repair_s` replaces all that by one repair time per unit (validation).
- volumes: a sample of `tracked` volumes (or all of them), each with its units' disks; a failure touches
  only the sampled units on the dead disks (a reverse index), never all volumes.

Rare losses (technique (a) of the research note): independent loss of a volume needs m + 1 overlapping
failures, ~1e-16 a year: unobservable. So each mode also runs with every failure rate k times higher, on
a cluster k times smaller (down to 4 hosts per unit of a volume; past that, the concurrency cap grows with
the extra failures, at most `failure_budget` of them a run). Either way the repair sees the same load as in
the real cluster, so the caps bind as often and rebuilds take as long, while each unit fails k times as
often: a volume's loss rate grows k^(m+1). Observed losses are scaled back by k^(m+1); k is chosen with the
analytic model to observe about `target_losses`, and the scaling is checked on up to three k: the fitted
slope of log(loss rate) against log(k) should be m + 1. The 99.9% Wilson interval of the loss proportion
(losses over volume-years) is scaled the same way. It bounds the sampling error only: losses cluster in
time (one bad week), which widens the true error, and the scaling is biased once k * AFR * rebuild time
stops being small, which the slope shows. No loss at the largest k gives an upper bound only.

Against the model: with one repair time per unit (`fixed_repair_s`) and independent failures the simulation
matches the chain within its interval (tests/unit/test_durability.py). With fluid repair they differ by a
factor up to ~2 either way: a lost unit waits for a uniformly random place in its disk's rebuild (the chain:
an exponential time of the same mean), urgent rebuilds come a fixed `priority_s` after detection, and the
concurrency cap stretches rebuilds when disks fail together (a host's 12 disks share it) where the chain gives
every disk the same rebuild time; the report shows the model both at the per-disk cap and at the rate the
simulated rebuilds actually reached.

The one-shot power event (a fraction f of disks never comes back, Copysets) is computed, not simulated:
for a volume's sampled rack pattern the loss probability is exact, then E = V * mean and P(any) = 1 - e^-E.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from blobstore_server.libs.durability import layout
from blobstore_server.libs.durability.model import GIB, SECONDS_PER_YEAR, ClusterParams, CodeShape, evaluate
from blobstore_server.libs.durability.power import PowerEvent, power_event
from blobstore_server.libs.ec import CodeMode, Tactic, tactic

WILSON_Z = 3.2905  # two-sided 99.9%


@dataclass(frozen=True)
class SimParams:
    nodes: int = 10_000
    disks_per_node: int = 12
    hosts_per_rack: int = 20
    years: float = 5.0
    disk_tb: float = 16.0
    fill: float = 0.8
    chunk_gib: float = 16.0
    disk_afr: float = 0.01
    host_afr: float = 0.005  # an assumption: hosts lost for good; transient outages end before detection
    rack_failures: bool = False
    rack_afr: float = 0.1  # Ford et al.: rack MTTF about 10 years
    rack_disk_loss: float = 0.01  # Copysets: 0.5-1% of disks do not come back after a power loss
    detect_s: float = 600.0
    disk_repair_mb_s: float = 31.0  # per failed disk
    max_tasks: int = 20  # SchedulerConfig.max_prepared
    task_mb_s: float = 40.0  # one repair task's rate (CubeFS level-1 shard repair example)
    margin_priority: bool = True
    priority_s: float = 1_200.0
    urgent_margin: int = 1  # services/scheduler/rules.URGENT_MARGIN
    fixed_repair_s: float | None = None
    tracked: int = 30_000  # volumes followed (a sample of the cluster's; all of them when fewer)
    target_losses: int = 200
    failure_budget: int = 15_000  # disk failures an inflated run may simulate (its cost)
    power_fraction: float = 0.01
    power_rack_share: float = 0.1  # a rack-clustered power event kills this share of the disks of the racks it hits
    seed: int = 0

    @property
    def chunk_bytes(self) -> float:
        return self.chunk_gib * GIB

    @property
    def units_per_disk(self) -> int:
        return int(self.disk_tb * 1e12 * self.fill // self.chunk_bytes)

    @property
    def unit_afr(self) -> float:
        """Failures a year of one unit: its disk, its host, and its rack's share (one unit per host and rack)."""
        rack = self.rack_afr * self.rack_disk_loss if self.rack_failures else 0.0
        return self.disk_afr + self.host_afr + rack

    def model_params(self, disks: int, hosts: int) -> ClusterParams:
        """The analytic model's inputs for the same cluster (one repair rate: the per-disk cap)."""
        rebuild = self.disk_repair_mb_s
        detect = self.detect_s
        if self.fixed_repair_s is not None:
            rebuild, detect = 1e12, self.fixed_repair_s
        return ClusterParams(disks=disks, hosts=hosts, disk_tb=self.disk_tb, fill=self.fill, chunk_gib=self.chunk_gib,
                             disk_afr=self.unit_afr, host_afr=0.0, detect_s=detect, rebuild_mb_s=rebuild,
                             margin_priority=self.margin_priority and self.fixed_repair_s is None,
                             priority_s=self.priority_s, urgent_margin=self.urgent_margin)


@dataclass(frozen=True)
class RunStats:
    """One simulated run of one mode at one failure-rate inflation k."""

    inflation: float
    disks: int
    volumes: float  # in this run's cluster
    tracked: int
    years: float
    losses: int  # tracked volumes lost
    disk_failures: int
    peak_repair_mb_s: float  # rebuilt MB/s summed over the disks being rebuilt
    mean_repair_mb_s: float
    peak_disks_in_repair: int
    mean_rebuild_hours: float  # from failure to fully rebuilt, over the disks rebuilt within the run
    level_volume_hours: tuple[float, ...]  # tracked volume-hours with 1..m units lost

    @property
    def volume_years(self) -> float:
        return self.tracked * self.years


def wilson(successes: int, trials: float, z: float = WILSON_Z) -> tuple[float, float]:
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


class _Records:
    """Lost-unit intervals of the tracked volumes, kept for the time-per-level figures."""

    def __init__(self) -> None:
        self.row: list[np.ndarray] = []
        self.size = 0
        self.start = np.empty(0)
        self.target = np.empty(0)  # the cumulative rebuilt-bytes level at which the unit is rebuilt
        self.deadline = np.empty(0)
        self.cleared = np.empty(0)

    def add(self, rows: np.ndarray, start: float, deadline: np.ndarray) -> np.ndarray:
        ids = np.arange(self.size, self.size + rows.size)
        self.size += rows.size
        if self.size > self.start.size:
            grow = max(self.size, 2 * self.start.size, 1024)
            for name in ("start", "target", "deadline", "cleared"):
                old = getattr(self, name)
                new = np.full(grow, np.inf)
                new[:old.size] = old
                setattr(self, name, new)
        self.row.append(rows)
        self.start[ids] = start
        self.deadline[ids] = deadline
        return ids


@dataclass
class _Run:
    """The mutable state of one run; `go` plays the events in time order."""

    params: SimParams
    tactic: Tactic
    topo: layout.Topology
    inflation: float
    tracked: int
    rng: np.random.Generator
    keep_records: bool
    load: float  # the failures the repair sees, times the real cluster's (its concurrency cap scales with it)
    clock: float = 0.0
    rebuilt: float = 0.0  # cumulative bytes rebuilt by each disk under repair since the start (all share a rate)
    rate: float = 0.0  # bytes/s of each disk under repair
    history: list[tuple[float, float]] = field(default_factory=list)
    losses: int = 0
    failures: int = 0
    peak: float = 0.0
    peak_disks: int = 0
    repaired_bytes: float = 0.0
    rebuild_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        p, disks = self.params, self.topo.disks
        self.width, self.tolerance = self.tactic.global_count, self.tactic.m
        placed = layout.sample(self.tactic, self.topo, self.tracked, self.rng)[:, :self.width]
        self.unit_disk = placed.ravel()
        self.by_disk = np.argsort(self.unit_disk, kind="stable")
        self.disk_start = np.searchsorted(self.unit_disk[self.by_disk], np.arange(disks + 1))
        units = self.unit_disk.size
        self.lost = np.zeros(units, dtype=bool)
        self.pos_end = np.zeros(units)
        self.deadline = np.full(units, np.inf)
        self.record = np.zeros(units, dtype=np.int64)
        self.records = _Records()
        self.open = np.zeros(disks, dtype=bool)
        self.fail_time = np.zeros(disks)
        self.noticed_at = np.full(disks, np.inf)  # `rebuilt` when the disk's rebuild began
        self.disk_bytes = p.units_per_disk * p.chunk_bytes
        self.global_cap = p.max_tasks * p.task_mb_s * 1e6 * self.load
        self.notices: deque[tuple[float, int]] = deque()
        self.repairing: deque[int] = deque()
        self.history.append((0.0, 0.0))

    def units_on(self, disk: int) -> np.ndarray:
        return self.by_disk[self.disk_start[disk]:self.disk_start[disk + 1]]

    def failures_plan(self, horizon: float) -> list[tuple[float, np.ndarray]]:
        """Every failure of the run, drawn up front: (time, disks lost)."""
        p, topo, k, rng = self.params, self.topo, self.inflation, self.rng
        years = p.years
        plan: list[tuple[float, np.ndarray]] = []
        for disk in rng.integers(0, topo.disks, size=rng.poisson(topo.disks * p.disk_afr * k * years)):
            plan.append((rng.uniform(0, horizon), np.array([disk])))
        for host in rng.integers(0, topo.hosts, size=rng.poisson(topo.hosts * p.host_afr * k * years)):
            plan.append((rng.uniform(0, horizon), host * topo.disks_per_host + np.arange(topo.disks_per_host)))
        if p.rack_failures:
            for rack in rng.integers(0, topo.racks, size=rng.poisson(topo.racks * p.rack_afr * k * years)):
                dead = np.flatnonzero(rng.random(topo.disks_per_rack) < p.rack_disk_loss)
                if dead.size:
                    plan.append((rng.uniform(0, horizon), rack * topo.disks_per_rack + dead))
        plan.sort(key=lambda event: event[0])
        return plan

    def advance(self, to: float) -> None:
        to = max(to, self.clock)  # a rebuild's end, computed, may round to just before now
        self.rebuilt += self.rate * (to - self.clock)
        self.repaired_bytes += self.rate * len(self.repairing) * (to - self.clock)
        self.clock = to

    def set_rate(self) -> None:
        busy = len(self.repairing)
        self.rate = min(self.params.disk_repair_mb_s * 1e6, self.global_cap / busy) if busy else 0.0
        self.peak = max(self.peak, self.rate * busy)
        self.peak_disks = max(self.peak_disks, busy)
        self.history.append((self.clock, self.rebuilt))

    def still_lost(self, units: np.ndarray) -> np.ndarray:
        """Which of `units` are lost and not rebuilt yet (the conditions only on the few lost ones: speed)."""
        result = self.lost[units]
        lost = units[result]
        disks = self.unit_disk[lost]
        result[result] = ((self.deadline[lost] > self.clock)
                          & (self.rebuilt < self.noticed_at[disks] + self.pos_end[lost]))
        return result

    def clear(self, units: np.ndarray) -> None:
        units = units[self.lost[units]]
        self.lost[units] = False
        self.deadline[units] = np.inf
        if self.keep_records:
            ids = self.record[units]
            self.records.cleared[ids] = np.minimum(self.records.cleared[ids], self.clock)

    def fail(self, disks: np.ndarray) -> None:
        p, now = self.params, self.clock
        disks = disks[~self.open[disks]]
        if not disks.size:
            return
        self.failures += disks.size
        delay = p.fixed_repair_s if p.fixed_repair_s is not None else p.detect_s
        for disk in disks.tolist():
            self.notices.append((now + delay, disk))
        self.open[disks] = True
        self.fail_time[disks] = now
        self.noticed_at[disks] = np.inf
        hit = np.concatenate([self.units_on(d) for d in disks.tolist()])
        if hit.size:
            self.hit(hit, several=disks.size > 1)

    def hit(self, hit: np.ndarray, several: bool) -> None:
        """Units on disks that just died: count each volume's losses, lose it or put it in the urgent lane. Only
        volumes with another unit marked lost (or two units hit at once) can have more than one: the rest of
        the work is on those few."""
        p, now, width = self.params, self.clock, self.width
        if several:
            rows, hits = np.unique(hit // width, return_counts=True)
        else:  # one disk holds one unit of a volume
            rows, hits = hit // width, np.ones(hit.size, dtype=np.int64)
        block = rows[:, None] * width + np.arange(width)
        block = block[self.lost[block].any(axis=1) | (hits > 1)]
        self.lost[hit] = True
        self.pos_end[hit] = (self.rng.integers(0, p.units_per_disk, size=hit.size) + 1) * p.chunk_bytes
        self.deadline[hit] = now + p.fixed_repair_s if p.fixed_repair_s is not None else np.inf
        if self.keep_records:
            self.record[hit] = self.records.add(hit // width, now, self.deadline[hit])
        lost = self.still_lost(block.ravel()).reshape(block.shape)
        count = lost.sum(axis=1)
        gone = count > self.tolerance
        if gone.any():
            self.losses += int(gone.sum())
            self.clear(block[gone].ravel())
        if p.margin_priority and p.fixed_repair_s is None:
            urgent = ~gone & (self.tolerance - count <= p.urgent_margin)
            units = block[urgent][lost[urgent]]
            if units.size:
                noticed = self.fail_time[self.unit_disk[units]] + p.detect_s
                self.deadline[units] = np.minimum(self.deadline[units], np.maximum(now, noticed) + p.priority_s)
                if self.keep_records:
                    self.records.deadline[self.record[units]] = self.deadline[units]

    def notice(self, disk: int) -> None:
        if self.params.fixed_repair_s is not None:
            self.close(disk)
            return
        self.noticed_at[disk] = self.rebuilt
        self.repairing.append(disk)
        self.set_rate()
        if self.keep_records:
            units = self.units_on(disk)
            units = units[self.lost[units]]
            self.records.target[self.record[units]] = self.rebuilt + self.pos_end[units]

    def close(self, disk: int) -> None:
        self.open[disk] = False
        self.rebuild_times.append(self.clock - self.fail_time[disk])
        self.clear(self.units_on(disk))

    def go(self) -> None:
        horizon = self.params.years * SECONDS_PER_YEAR
        plan = self.failures_plan(horizon)
        index = 0
        while True:
            next_failure = plan[index][0] if index < len(plan) else math.inf
            next_notice = self.notices[0][0] if self.notices else math.inf
            step = min(next_failure, next_notice, horizon)
            while self.repairing:  # rebuilds that end first: all run at one rate, so in the order begun
                head = self.repairing[0]
                done = self.clock + (self.noticed_at[head] + self.disk_bytes - self.rebuilt) / self.rate
                if done > step:
                    break
                self.advance(done)
                self.repairing.popleft()
                self.close(head)
                self.set_rate()
            self.advance(step)
            if step >= horizon:
                break
            if next_notice <= next_failure:
                self.notice(self.notices.popleft()[1])
            else:
                self.fail(plan[index][1])
                index += 1
        self.history.append((self.clock, self.rebuilt))

    def level_hours(self) -> tuple[float, ...]:
        """Tracked volume-hours spent with 1..m units lost, from the lost-unit intervals."""
        r = self.records
        if not r.size:
            return (0.0,) * self.tolerance
        times, levels = np.array(self.history).T
        # While nothing is rebuilt the level stays flat: a unit's rebuild resumes at the flat's last instant.
        levels, last = np.unique(levels[::-1], return_index=True)
        fluid_end = np.interp(r.target[:r.size], levels, times[::-1][last], right=np.inf)
        end = np.minimum.reduce([fluid_end, r.deadline[:r.size], r.cleared[:r.size], np.full(r.size, self.clock)])
        rows = np.concatenate(r.row)
        when = np.concatenate([r.start[:r.size], end])
        step = np.concatenate([np.ones(r.size, dtype=np.int64), -np.ones(r.size, dtype=np.int64)])
        row = np.concatenate([rows, rows])
        order = np.lexsort((-step, when, row))  # a start before an end at one instant
        when, step, row = when[order], step[order], row[order]
        level = np.cumsum(step)
        span = np.where(row[1:] == row[:-1], when[1:] - when[:-1], 0.0)
        hours = np.bincount(level[:-1], weights=span, minlength=self.tolerance + 2) / 3600
        return tuple(float(h) for h in hours[1:self.tolerance + 1])

    def stats(self) -> RunStats:
        seconds = max(self.clock, 1.0)
        volumes = self.topo.disks * self.params.units_per_disk / self.tactic.total
        mean_rebuild = float(np.mean(self.rebuild_times)) / 3600 if self.rebuild_times else 0.0
        return RunStats(self.inflation, self.topo.disks, volumes, self.tracked, self.params.years, self.losses,
                        self.failures, self.peak / 1e6, float(self.repaired_bytes / seconds / 1e6), self.peak_disks,
                        mean_rebuild, self.level_hours() if self.keep_records else (0.0,) * self.tolerance)


def smallest_shrink(params: SimParams, t: Tactic) -> float:
    """How many times smaller than the real one a cluster may get: it keeps 4 hosts per unit of a volume."""
    return max(1.0, params.nodes / (4 * t.total))


def run(params: SimParams, mode: CodeMode, *, inflation: float = 1.0, tracked: int | None = None,
        keep_records: bool = True, seed: int | None = None) -> RunStats:
    """One run with every failure rate times `inflation`, following `tracked` volumes (default
    `params.tracked`, at most all of them). The cluster shrinks by as much of `inflation` as it can
    (`smallest_shrink`); the rest multiplies the failures the repair sees, and so the concurrency cap with them,
    so that the caps bind as often as in the real cluster."""
    t = tactic(mode)
    nodes = max(1, round(params.nodes / min(inflation, smallest_shrink(params, t))))
    # Smaller racks in a smaller cluster, so a volume still finds a rack per unit as in the real one.
    slot = max(Counter(t.unit_az(i) for i in range(t.total)).values())
    per_rack = max(1, min(params.hosts_per_rack, nodes // t.az_count // slot))
    topo = layout.Topology.build(nodes, params.disks_per_node, per_rack, t.az_count)
    full = layout.Topology.build(params.nodes, params.disks_per_node, params.hosts_per_rack, t.az_count)
    load = max(1.0, inflation * topo.disks / full.disks)
    inflation = full.disks / topo.disks * load
    volumes = int(topo.disks * params.units_per_disk / t.total)
    count = min(volumes, tracked if tracked is not None else params.tracked)
    rng = np.random.default_rng(params.seed if seed is None else seed)
    state = _Run(params, t, topo, inflation, count, rng, keep_records, load)
    state.go()
    return state.stats()


@dataclass(frozen=True)
class LossEstimate:
    """Independent-failure loss at the real failure rates, scaled back from the inflated runs."""

    inflation: float  # k of the run the estimate comes from (the largest)
    losses: int
    volume_years: float
    p_object: float  # annual loss probability of one volume
    p_object_low: float
    p_object_high: float  # 99.9% Wilson bounds, scaled like the estimate
    expected: float  # volumes lost per year in the full cluster
    p_any: float
    p_any_high: float
    slope: float | None  # fitted d log(loss rate) / d log(k) over the runs with losses; m + 1 expected
    points: tuple[tuple[float, int, float], ...]  # (k, losses, volume-years) of every inflated run
    model_losses: float  # the analytic model's expected losses in the largest run (exposure from the real run)


@dataclass(frozen=True)
class ModeSimulation:
    mode: str
    tolerance: int
    disks: int
    volumes: float
    real: RunStats  # the run at the real failure rates
    level_hours_per_year: tuple[float, ...]  # all volumes' hours with 1..m units lost, per year
    estimate: LossEstimate
    model_p_object: float  # the model at the per-disk cap (what `blobstore durability` prints)
    effective_rebuild_mb_s: float  # a disk's bytes over its mean time from detection to rebuilt, in the real run
    model_p_object_effective: float  # the model at that rate: the caps' queueing folded in
    power: PowerEvent


@dataclass(frozen=True)
class SimReport:
    params: SimParams
    modes: tuple[ModeSimulation, ...]
    seconds: float


def _model(params: SimParams, mode: CodeMode, disks: int, hosts: int, rebuild_mb_s: float, afr_scale: float = 1.0
           ) -> float:
    cluster = replace(params.model_params(disks, hosts), rebuild_mb_s=rebuild_mb_s)
    cluster = replace(cluster, disk_afr=cluster.disk_afr * afr_scale)
    return evaluate(cluster, CodeShape.of(mode)).p_object


def _solve_log(f: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The x in [low, high] where the increasing f reaches `target` (bisection on log x); `high` if it never does."""
    if f(high) < target:
        return high
    a, b = math.log(low), math.log(high)
    for _ in range(40):
        middle = (a + b) / 2
        a, b = (middle, b) if f(math.exp(middle)) < target else (a, middle)
    return math.exp(b)


def _estimate(params: SimParams, mode: CodeMode, full: layout.Topology, effective_mb_s: float,
              tracked: int) -> LossEstimate:
    t = tactic(mode)
    power = t.m + 1
    shrink_max = smallest_shrink(params, t)
    real_failures = full.disks * params.unit_afr * params.years
    k_max = shrink_max * max(1.0, params.failure_budget / real_failures)
    volumes_full = full.disks * params.units_per_disk / t.total

    def expected_losses(k: float) -> float:
        followed = min(tracked, volumes_full / min(k, shrink_max))
        p = _model(params, mode, full.disks, full.hosts, effective_mb_s, k)
        return p * followed * params.years

    # Past the smallest cluster a run costs more events, at most `failure_budget`; none seen gives a bound.
    top = _solve_log(expected_losses, params.target_losses, 1.0, k_max)
    ks = [top] + [top * 4 ** (-j / power) for j in (1, 2) if expected_losses(top * 4 ** (-j / power)) >= 10]
    # One seed for every k (common random numbers): the runs differ by k, not by their failure histories.
    runs = [run(params, mode, inflation=k, tracked=tracked, keep_records=False, seed=params.seed + 1) for k in ks]
    best = runs[0]
    scale = best.inflation ** power
    p_obs = best.losses / best.volume_years
    low, high = wilson(best.losses, best.volume_years)
    usable = [r for r in runs if r.losses]
    slope = None
    if len(usable) >= 2:
        x = np.log([r.inflation for r in usable])
        y = np.log([r.losses / r.volume_years for r in usable])
        slope = float(np.polyfit(x, y, 1)[0])
    p_object = p_obs / scale
    expected = p_object * volumes_full
    return LossEstimate(best.inflation, best.losses, best.volume_years, p_object, low / scale, high / scale,
                        expected, -math.expm1(-expected), -math.expm1(-high / scale * volumes_full), slope,
                        tuple((r.inflation, r.losses, r.volume_years) for r in runs),
                        _model(params, mode, full.disks, full.hosts, effective_mb_s, best.inflation)
                        * best.volume_years)


def simulate_mode(params: SimParams, mode: CodeMode) -> ModeSimulation:
    t = tactic(mode)
    full = layout.Topology.build(params.nodes, params.disks_per_node, params.hosts_per_rack, t.az_count)
    volumes = full.disks * params.units_per_disk / t.total
    real = run(params, mode)
    disk_bytes = params.units_per_disk * params.chunk_bytes
    busy_s = real.mean_rebuild_hours * 3600 - params.detect_s
    effective = disk_bytes / busy_s / 1e6 if real.mean_rebuild_hours and busy_s > 0 else params.disk_repair_mb_s
    if params.fixed_repair_s is not None:
        effective = params.disk_repair_mb_s
    scale = volumes / real.tracked / params.years
    power = power_event(t, full, volumes, params.power_fraction, params.power_rack_share,
                        np.random.default_rng(params.seed))
    return ModeSimulation(
        mode.name, t.m, full.disks, volumes, real, tuple(h * scale for h in real.level_volume_hours),
        _estimate(params, mode, full, effective, params.tracked),
        _model(params, mode, full.disks, full.hosts, params.disk_repair_mb_s), effective,
        _model(params, mode, full.disks, full.hosts, effective), power)


def simulate(params: SimParams, modes: tuple[CodeMode, ...]) -> SimReport:
    started = time.perf_counter()
    results = tuple(simulate_mode(params, mode) for mode in modes)
    return SimReport(params, results, time.perf_counter() - started)
