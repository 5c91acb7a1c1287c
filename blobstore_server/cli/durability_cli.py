"""`blobstore durability [simulate]`: how likely data loss is, per code mode, from the analytic model or from a
failure-and-repair simulation (libs/durability). Neither needs a running cluster.

The repair rate (MB/s rebuilt per failed disk) is `--repair-mb-s`, else `rebuild_mb_s` from
bench/results/repair.json (bench/repair.py), else 31 MB/s, the last rate that bench measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from blobstore_server.cli.cli_common import JsonOpt, emit, out
from blobstore_server.libs.durability.model import (
    DEFAULT_MODES,
    MEASURED_REBUILD_MB_S,
    RATE_FLOOR_MB_S,
    ClusterParams,
    ModeReport,
    report,
)
from blobstore_server.libs.durability.simulate import ModeSimulation, SimParams, SimReport, simulate
from blobstore_server.libs.ec import CodeMode, parse_code_mode
from blobstore_server.libs.proto.scheduler import DEFAULT_BROKEN_AFTER
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.scheduler.rules import URGENT_MARGIN

BENCH_RESULT = Path("bench/results/repair.json")
MODE_NAMES = ",".join(m.name for m in DEFAULT_MODES)
# A failed host or disk is noticed after disk_broken_after; the scheduler's urgent lane then takes its volumes.
DEFAULT_MAX_TASKS: int = SchedulerConfig.model_fields["max_prepared"].default

durability_app = typer.Typer(help="How likely data loss is, per code mode: the model, or `simulate`.",
                             pretty_exceptions_show_locals=False)

RateOpt = Annotated[float | None, typer.Option(
    "--repair-mb-s", help="MB/s rebuilt per failed disk (default: rebuild_mb_s of bench/results/repair.json, "
    f"else {MEASURED_REBUILD_MB_S:g}, last measured).")]
AfrOpt = Annotated[float, typer.Option(
    "--afr", help="Disk annual failure rate. Backblaze Drive Stats 2024 saw 1.4-1.6% over ~300k drives; "
    "1% is the research note's baseline (enterprise drives, better cooled), 2% a stress case.")]
DetectOpt = Annotated[float, typer.Option("--detect-s", help="Seconds before a silent disk counts as broken "
                                                              "(disk_broken_after).")]
PriorityOpt = Annotated[bool, typer.Option(
    "--priority/--no-priority", help=f"Margin priority: volumes at margin <= {URGENT_MARGIN} rebuilt within "
    "--priority-s of detection, past the caps (the scheduler does this).")]
PrioritySOpt = Annotated[float, typer.Option("--priority-s", help="Seconds from detection to an urgent rebuild.")]
ModesOpt = Annotated[str, typer.Option("--modes", help="Code modes, comma-separated.")]


def _repair_rate(given: float | None, bench: Path = BENCH_RESULT) -> tuple[float, str]:
    """The rebuild rate to use and where it came from."""
    if given is not None:
        return given, "--repair-mb-s"
    if bench.exists():
        measured = json.loads(bench.read_text()).get("rebuild_mb_s")
        if measured:
            return float(measured), str(bench)
    return MEASURED_REBUILD_MB_S, "last measured by bench/repair.py"


def _modes(text: str) -> tuple[CodeMode, ...]:
    return tuple(parse_code_mode(name) for name in text.split(",") if name.strip())


def _g(value: float) -> str:
    return f"{value:.2g}"


def _rate(value: float | None) -> str:
    if value is None:
        return "unreachable"
    return f"<={RATE_FLOOR_MB_S:g}" if value <= RATE_FLOOR_MB_S else f"{value:.3g}"


def _model_row(row: ModeReport) -> dict[str, object]:
    d = row.durability
    return {"mode": d.mode, "n/m": f"{d.width}/{d.tolerance}", "volumes": f"{d.volumes:.3g}",
            "rebuild h": f"{d.rebuild_hours:.0f}", "P obj/yr": _g(d.p_object), "obj 9s": f"{d.object_nines:.1f}",
            "lost/yr": _g(d.expected_losses), "P any/yr": _g(d.p_any), "any 9s": f"{d.cluster_nines:.1f}",
            "MB/s: obj 11 9s": _rate(row.rate_for_object_11_nines),
            "any<1e-6": _rate(row.rate_for_cluster_1e6),
            "any<1e-6 no prio": _rate(row.rate_for_cluster_1e6_without_priority)}


@durability_app.callback(invoke_without_command=True)
def durability(ctx: typer.Context, as_json: JsonOpt = False,
               disks: Annotated[int, typer.Option(help="Disks in the cluster.")] = 10_000,
               hosts: Annotated[int, typer.Option(help="Hosts (one unit of a volume per host).")] = 500,
               disk_tb: Annotated[float, typer.Option(help="Disk size, decimal TB.")] = 16.0,
               fill: Annotated[float, typer.Option(help="Share of each disk used.")] = 0.8,
               chunk_gib: Annotated[float, typer.Option(help="Chunk (unit) size, GiB.")] = 16.0,
               afr: AfrOpt = 0.01,
               host_afr: Annotated[float, typer.Option(help="Hosts lost for good a year, with their disks.")] = 0.0,
               detect_s: DetectOpt = DEFAULT_BROKEN_AFTER, repair_mb_s: RateOpt = None,
               priority: PriorityOpt = True, priority_s: PrioritySOpt = 1_200.0,
               modes: ModesOpt = MODE_NAMES) -> None:
    """Annual loss per code mode from the Markov model: per object (one volume) and cluster-wide (any volume),
    and the rebuild rate each needs for 11 nines per object and for P(any loss) < 1e-6 a year."""
    if ctx.invoked_subcommand is not None:
        return
    rate, source = _repair_rate(repair_mb_s)
    params = ClusterParams(disks=disks, hosts=hosts, disk_tb=disk_tb, fill=fill, chunk_gib=chunk_gib, disk_afr=afr,
                           host_afr=host_afr, detect_s=detect_s, rebuild_mb_s=rate, margin_priority=priority,
                           priority_s=priority_s, urgent_margin=URGENT_MARGIN)
    rows = report(params, _modes(modes))
    if as_json:
        typer.echo(json.dumps({"params": asdict(params), "rate_source": source,
                               "modes": [{**asdict(r), "object_nines": r.durability.object_nines,
                                          "cluster_nines": r.durability.cluster_nines} for r in rows]}, indent=2))
        return
    emit([_model_row(r) for r in rows], False,
          title=f"{disks} disks x {disk_tb:g} TB, {fill:.0%} full, AFR {afr:.1%}, rebuild {rate:g} MB/s per failed "
                f"disk ({source}), detection {detect_s:g} s, margin priority {'on' if priority else 'off'}")


def _levels(hours: tuple[float, ...]) -> str:
    return " ".join(f"{lost}:{h:.2g}" for lost, h in enumerate(hours, start=1))


def _sim_rows(result: ModeSimulation) -> dict[str, object]:
    e, real = result.estimate, result.real
    slope = "-" if e.slope is None else f"{e.slope:.1f}"
    lost = (f"{e.expected:.2g} [{e.p_object_low * result.volumes:.2g}, {e.p_object_high * result.volumes:.2g}]"
            if e.losses else f"< {e.p_object_high * result.volumes:.2g}")
    return {"mode": result.mode, "disks": result.disks, "volumes": f"{result.volumes:.3g}",
            "rebuild h (mean)": f"{real.mean_rebuild_hours:.0f}", "peak repair MB/s": f"{real.peak_repair_mb_s:.0f}",
            "peak disks in repair": real.peak_disks_in_repair,
            "volume-h/yr by units lost": _levels(result.level_hours_per_year),
            "lost/yr [99.9%]": lost, "P(any)/yr": _g(e.p_any) if e.losses else f"< {_g(e.p_any_high)}",
            "k: losses (m+1 slope)": f"{e.inflation:.0f}: {e.losses} ({slope}, m+1={result.tolerance + 1})",
            "model P(any) at cap / at sim rate": f"{_g(_any(result.model_p_object, result))} / "
                                                  f"{_g(_any(result.model_p_object_effective, result))}"}


def _any(p_object: float, result: ModeSimulation) -> float:
    return -math.expm1(result.volumes * math.log1p(-p_object))


def _power_rows(result: ModeSimulation) -> dict[str, object]:
    p = result.power
    return {"mode": result.mode, "scattered (any placement)": _g(p.scattered_p_any),
            "rack-clustered, random placement": _g(p.clustered_random_p_any),
            "rack-clustered, rack-aware": _g(p.clustered_rack_aware_p_any)}


def _show(sim: SimReport) -> None:
    p = sim.params
    emit([_sim_rows(r) for r in sim.modes], False,
          title=f"{p.nodes} hosts x {p.disks_per_node} disks, {p.years:g} years, disk AFR {p.disk_afr:.1%}, host AFR "
                f"{p.host_afr:.1%}{', rack events' if p.rack_failures else ''}; rebuild <= {p.disk_repair_mb_s:g} MB/s "
                f"per disk and <= {p.max_tasks} x {p.task_mb_s:g} MB/s in all; margin priority "
                f"{'on' if p.margin_priority else 'off'}")
    out.print("lost/yr and P(any): independent failures, observed at k times the failure rates (on a smaller "
              "cluster, or with more failures and a larger concurrency cap: the same repair load) and scaled by "
              "k^(m+1); the interval is the 99.9% Wilson bound of that run (losses come in bursts, so the truer "
              "error is wider; the slope over several k checks the scaling). '<' is a bound: none was seen.",
              markup=False)
    emit([_power_rows(r) for r in sim.modes], False,
          title=f"P(any volume lost) when {p.power_fraction:.0%} of disks never come back after a power event")
    out.print(f"simulated in {sim.seconds:.0f} s")


@durability_app.command("simulate")
def simulate_command(
        as_json: JsonOpt = False,
        nodes: Annotated[int, typer.Option(help="Hosts.")] = 10_000,
        disks_per_node: Annotated[int, typer.Option(help="Disks per host.")] = 12,
        hosts_per_rack: Annotated[int, typer.Option(help="Hosts per rack.")] = 20,
        years: Annotated[float, typer.Option(help="Simulated years per run.")] = 5.0,
        rack_failures: Annotated[bool, typer.Option(
            "--rack-failures", help="Rack events (MTTF 10 y, Ford et al.), 1% of their disks lost for good.")] = False,
        seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
        afr: AfrOpt = 0.01,
        host_afr: Annotated[float, typer.Option(help="Hosts lost for good a year, with their disks.")] = 0.005,
        detect_s: DetectOpt = DEFAULT_BROKEN_AFTER, repair_mb_s: RateOpt = None,
        max_tasks: Annotated[int, typer.Option(help="Repair tasks in flight, cluster-wide (max_prepared).")]
        = DEFAULT_MAX_TASKS,
        task_mb_s: Annotated[float, typer.Option(help="MB/s of one repair task.")] = 40.0,
        priority: PriorityOpt = True, priority_s: PrioritySOpt = 1_200.0,
        tracked: Annotated[int, typer.Option(help="Volumes followed per run (a sample).")] = 30_000,
        failure_budget: Annotated[int, typer.Option(help="Disk failures an inflated run may simulate.")] = 15_000,
        modes: ModesOpt = MODE_NAMES) -> None:
    """Simulate disk, host and rack failures and their repair over years, per code mode: volumes lost a year
    (with a 99.9% interval), hours at each level of lost units, peak repair bandwidth, and a power event."""
    rate, _ = _repair_rate(repair_mb_s)
    params = SimParams(nodes=nodes, disks_per_node=disks_per_node, hosts_per_rack=hosts_per_rack, years=years,
                       disk_afr=afr, host_afr=host_afr, rack_failures=rack_failures, detect_s=detect_s,
                       disk_repair_mb_s=rate, max_tasks=max_tasks, task_mb_s=task_mb_s, margin_priority=priority,
                       priority_s=priority_s, urgent_margin=URGENT_MARGIN, tracked=tracked, seed=seed,
                       failure_budget=failure_budget)
    sim = simulate(params, _modes(modes))
    if as_json:
        typer.echo(json.dumps(asdict(sim), indent=2, default=float))
        return
    _show(sim)
