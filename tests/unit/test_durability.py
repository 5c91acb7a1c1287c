from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from blobstore_server.cli.cli import app
from blobstore_server.cli.durability_cli import _repair_rate
from blobstore_server.libs.durability import layout
from blobstore_server.libs.durability.model import (
    ELEVEN_NINES,
    ClusterParams,
    CodeShape,
    evaluate,
    mean_time_to_loss,
    required_rate,
)
from blobstore_server.libs.durability.power import loss_probability, power_event, rack_patterns
from blobstore_server.libs.durability.simulate import SimParams, run, simulate, wilson
from blobstore_server.libs.ec import CodeMode, tactic
from blobstore_server.libs.placement import Candidate, place_volume


def one_repair_time(hours: float, **changes: object) -> ClusterParams:
    """Every lost unit rebuilt `hours` after its failure: detection only, an instant rebuild, no priority."""
    return replace(ClusterParams(detect_s=hours * 3600, rebuild_mb_s=1e15, margin_priority=False), **changes)


def test_two_units_one_parity_matches_the_chain_solved_by_hand() -> None:
    # States 0 -> 1 at 2 lam, 1 -> 0 at mu, 1 -> lost at lam: MTTDL = (3 lam + mu) / (2 lam^2).
    lam, mu = 0.05, 300.0
    assert mean_time_to_loss(2, 1, lam, [1 / mu]) == pytest.approx((3 * lam + mu) / (2 * lam**2), rel=1e-12)


@pytest.mark.parametrize(("width", "tolerance"), [(9, 3), (14, 4), (12, 6)])
def test_classic_closed_form_where_repair_is_much_faster_than_failure(width: int, tolerance: int) -> None:
    lam, mu = 0.01, 365.0 * 24  # one-hour repairs: mu / lam ~ 1e6
    closed = math.factorial(tolerance) * mu**tolerance / (lam ** (tolerance + 1) * math.perm(width, tolerance + 1))
    assert mean_time_to_loss(width, tolerance, lam, [1 / mu] * tolerance) == pytest.approx(closed, rel=1e-3)


def test_recursion_agrees_with_a_dense_solve_while_that_one_still_has_digits() -> None:
    width, tolerance, lam, exposures = 6, 2, 0.2, [0.01, 0.005]
    q = np.zeros((tolerance + 1, tolerance + 1))
    for lost in range(tolerance + 1):
        up, down = (width - lost) * lam, (lost / exposures[lost - 1] if lost else 0.0)
        q[lost, lost] = -(up + down)
        if lost < tolerance:
            q[lost, lost + 1] = up
        if lost:
            q[lost, lost - 1] = down
    dense = np.linalg.solve(-q, np.ones(tolerance + 1))[0]
    assert mean_time_to_loss(width, tolerance, lam, exposures) == pytest.approx(dense, rel=1e-9)


@pytest.mark.parametrize(("hours", "p_object", "expected"),
                         [(1, 7.5e-18, 6.2e-12), (24, 1.0e-13, 8.6e-8), (110, 1.0e-11, 8.4e-6), (168, 3.6e-11, 2.9e-5)])
def test_the_research_notes_worked_example(hours: float, p_object: float, expected: float) -> None:
    result = evaluate(one_repair_time(hours), CodeShape.of(CodeMode.EC6P3))
    assert result.volumes == pytest.approx(8.3e5, rel=0.01)
    assert result.p_object == pytest.approx(p_object, rel=0.04)
    assert result.expected_losses == pytest.approx(expected, rel=0.04)


@pytest.mark.parametrize(("mode", "days", "priority", "p_any"), [
    (CodeMode.EC6P3, 1, False, 1.1e-8), (CodeMode.EC6P3, 1, True, 1.9e-11), (CodeMode.EC6P3, 7, False, 3.7e-6),
    (CodeMode.EC6P3, 7, True, 1.3e-10), (CodeMode.EC3P3, 1, False, 2.0e-9), (CodeMode.EC3P3, 7, True, 2.3e-11)])
def test_the_research_notes_priority_table(mode: CodeMode, days: float, priority: bool, p_any: float) -> None:
    # The note: 15 min detection, a whole-disk rebuild of `days`, urgent volumes rebuilt 30 min after failure.
    base = ClusterParams(detect_s=900, priority_s=900, margin_priority=priority)
    params = replace(base, rebuild_mb_s=base.rebuild_bytes / (days * 86_400) / 1e6)
    assert evaluate(params, CodeShape.of(mode)).p_any == pytest.approx(p_any, rel=0.06)


def test_required_rate_lands_on_the_target() -> None:
    params, shape = ClusterParams(margin_priority=False), CodeShape.of(CodeMode.EC6P3)
    rate = required_rate(params, shape, lambda d: d.p_any < 1e-6)
    assert rate is not None
    assert evaluate(replace(params, rebuild_mb_s=rate), shape).p_any == pytest.approx(1e-6, rel=1e-3)
    assert evaluate(replace(params, rebuild_mb_s=rate * 0.9), shape).p_any > 1e-6
    # Detection alone (a month) already breaks 11 nines: no rate is enough.
    assert required_rate(replace(params, detect_s=30 * 86_400), shape, lambda d: d.p_object < ELEVEN_NINES) is None


def test_lrc_counts_its_global_units_and_holds_more_volumes_per_disk() -> None:
    rs, lrc = CodeShape.of(CodeMode.EC6P3), CodeShape.of(CodeMode.EC6P3L3)
    assert (lrc.width, lrc.tolerance, lrc.units) == (9, 3, 12)
    a, b = evaluate(ClusterParams(), rs), evaluate(ClusterParams(), lrc)
    assert b.p_object == a.p_object and b.volumes == pytest.approx(a.volumes * 9 / 12)


def test_repair_rate_comes_from_the_option_then_the_bench_then_the_last_measure(tmp_path: Path) -> None:
    bench = tmp_path / "repair.json"
    assert _repair_rate(None, bench)[0] == 31.0
    bench.write_text(json.dumps({"ratio": 0.4}))
    assert _repair_rate(None, bench)[0] == 31.0
    bench.write_text(json.dumps({"rebuild_mb_s": 55.5}))
    assert _repair_rate(None, bench) == (55.5, str(bench))
    assert _repair_rate(12.0, bench)[0] == 12.0


def candidates_like(topo: layout.Topology) -> list[Candidate]:
    """The same cluster as `topo`, as clustermgr's placement sees it (disk ids in the same order)."""
    out = []
    for az in range(topo.az_count):
        for rack in range(topo.racks_per_az):
            for host in range(topo.hosts_per_rack):
                for _ in range(topo.disks_per_host):
                    out.append(Candidate(len(out), f"z{az}-r{rack}-h{host}", f"z{az}", f"z{az}-r{rack}", 100))
    return out


def rack_occupancy(topo: layout.Topology, disks: list[int]) -> tuple[int, ...]:
    return tuple(sorted(Counter(int(topo.rack_of(np.array(d))) for d in disks).values()))


@pytest.mark.parametrize(("mode", "topo"), [
    (CodeMode.EC6P3, layout.Topology(1, 12, 2, 2)),  # more racks than units: one unit per rack
    (CodeMode.EC6P3, layout.Topology(1, 4, 3, 2)),  # fewer: 3, 2, 2, 2 over the racks
    (CodeMode.EC6P6, layout.Topology(3, 3, 2, 2)),  # three AZs of four units over three racks
])
def test_vectorized_placement_follows_place_volume(mode: CodeMode, topo: layout.Topology) -> None:
    t, count = tactic(mode), 1500
    pool = candidates_like(topo)
    rng = random.Random(7)
    reference = [[c.disk_id for c in place_volume(t, pool, rng=rng)] for _ in range(count)]
    ours = layout.sample(t, topo, count, np.random.default_rng(7)).tolist()
    for placed in (reference, ours):
        for row in placed:
            assert len({int(topo.host_of(np.array(d))) for d in row}) == t.total  # one unit per host
            assert [pool[d].idc for d in row] == [f"z{t.unit_az(i)}" for i in range(t.total)]  # AZ slots
        assert {rack_occupancy(topo, row) for row in placed} == {rack_occupancy(topo, reference[0])}
    # Both use every disk about as often.
    expected = count * t.total / topo.disks
    for placed in (reference, ours):
        uses = np.bincount(np.array(placed).ravel(), minlength=topo.disks)
        assert np.abs(uses - expected).max() < 5 * math.sqrt(expected)


def test_random_placement_ignores_racks_and_is_worse_in_a_rack_clustered_power_event() -> None:
    t, topo, rng = tactic(CodeMode.EC6P3), layout.Topology(1, 40, 20, 12), np.random.default_rng(1)
    patterns, _ = rack_patterns(t, topo, 2000, rng, rack_aware=True)
    assert patterns.tolist() == [[1] * 9]
    assert len(rack_patterns(t, topo, 2000, rng, rack_aware=False)[0]) > 1
    event = power_event(t, topo, 8.3e5, 0.01, 0.1, rng)
    # The research note: 1% of 10,000 disks dead at once loses an EC6P3 volume with 63%.
    assert event.scattered_p_any == pytest.approx(0.63, abs=0.02)
    assert event.clustered_rack_aware_p_any == pytest.approx(event.scattered_p_any, rel=0.01)
    assert event.clustered_random_expected > 2 * event.scattered_expected


def test_loss_probability_is_the_binomial_tail_for_scattered_deaths() -> None:
    f = 0.01
    tail = sum(math.comb(9, k) * f**k * (1 - f) ** (9 - k) for k in range(4, 10))
    assert loss_probability([1] * 9, 3, f, 1.0) == pytest.approx(tail, rel=1e-12)
    assert loss_probability([9], 3, 1.0, f) == pytest.approx(tail, rel=1e-12)


def test_wilson_interval() -> None:
    low, high = wilson(0, 1000)
    assert low == 0 and high == pytest.approx(3.2905**2 / 1000, rel=0.02)
    low, high = wilson(50, 100)
    assert low < 0.5 < high


def test_simulation_matches_the_model_with_one_repair_time_and_inflated_afr() -> None:
    # 288 disks at an AFR of 700%, every lost unit rebuilt one day after it failed: the chain's assumptions.
    params = SimParams(nodes=24, disks_per_node=12, hosts_per_rack=4, years=2, disk_afr=7.0, host_afr=0.0,
                       fixed_repair_s=86_400, tracked=12_000, seed=3)
    stats = run(params, CodeMode.EC3P3)
    model = evaluate(params.model_params(stats.disks, 24), CodeShape.of(CodeMode.EC3P3)).p_object
    low, high = wilson(stats.losses, stats.volume_years)
    assert stats.losses > 20
    assert low <= model <= high


def test_a_quiet_cluster_loses_nothing_and_repair_stays_under_its_caps() -> None:
    params = SimParams(nodes=200, years=1, disk_afr=0.0, host_afr=0.0, tracked=5_000)
    stats = run(params, CodeMode.EC6P3)
    assert (stats.losses, stats.disk_failures, stats.peak_repair_mb_s) == (0, 0, 0.0)
    busy = run(replace(params, disk_afr=0.05, max_tasks=4, task_mb_s=20.0), CodeMode.EC6P3)
    assert 0 < busy.peak_repair_mb_s <= 80.0 + 1e-6  # four tasks of 20 MB/s
    assert busy.mean_rebuild_hours * 3600 > params.detect_s + params.units_per_disk * params.chunk_bytes / 31e6


def test_margin_priority_cuts_time_at_two_lost_units() -> None:
    params = SimParams(nodes=100, years=2, disk_afr=0.5, host_afr=0.0, tracked=20_000, seed=5)
    slow = run(replace(params, margin_priority=False), CodeMode.EC3P3)
    fast = run(params, CodeMode.EC3P3)
    assert fast.level_volume_hours[0] == pytest.approx(slow.level_volume_hours[0], rel=0.05)
    assert fast.level_volume_hours[1] < slow.level_volume_hours[1] / 5


def test_simulate_reports_every_mode_quickly() -> None:
    params = SimParams(nodes=300, years=1, tracked=3_000, target_losses=20, failure_budget=1_000)
    report = simulate(params, (CodeMode.EC6P3, CodeMode.EC6P6))
    assert [m.mode for m in report.modes] == ["EC6P3", "EC6P6"]
    for mode in report.modes:
        assert mode.estimate.p_any_high > 0 and len(mode.level_hours_per_year) == mode.tolerance
        assert mode.power.scattered_p_any > 0


def test_cli_prints_the_model_and_runs_the_simulation() -> None:
    runner = CliRunner()
    model = runner.invoke(app, ["durability", "--json", "--repair-mb-s", "31", "--modes", "EC6P3,EC6P6"])
    assert model.exit_code == 0, model.output
    rows = json.loads(model.output)["modes"]
    assert [r["durability"]["mode"] for r in rows] == ["EC6P3", "EC6P6"]
    assert rows[0]["rate_for_cluster_1e6_without_priority"] == pytest.approx(32.8, rel=0.02)
    table = runner.invoke(app, ["durability", "--no-priority"])
    assert table.exit_code == 0 and "priority off" in table.output
    sim = runner.invoke(app, ["durability", "simulate", "--nodes", "200", "--years", "1", "--modes", "EC3P3",
                              "--tracked", "2000", "--failure-budget", "500", "--json"])
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.output)["modes"][0]["mode"] == "EC3P3"
