"""What an idle cluster costs: CPU per process of the default cluster (`cluster up`) while nobody uses it.

Every busy second of an idle process is taken from the requests of a loaded one on the same box (issue 29:
~0.6 ms of every small PUT's CPU was the background's). Brings the default cluster up with the launcher,
lets it settle (first volumes, leader elections, consumer groups), then reads each process's CPU over
`--seconds`. The baseline measured in the same run is a bare asyncio loop waking every 50 ms (what any
process that keeps a heartbeat costs at the least). Writes bench/results/idle.json and prints one line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_seconds
from blobstore_server.cluster import launcher

_BARE_LOOP = """import asyncio
async def main():
    while True:
        await asyncio.sleep(0.05)
asyncio.run(main())"""


def cpu_rates(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Milliseconds of CPU per second of each named process over `seconds`."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: round((cpu_seconds(pid) - before[name]) * 1e3 / seconds, 1) for name, pid in pids.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after `up` before measuring")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds measured")
    parser.add_argument("--out", default="bench/results/idle.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root)
        bare = subprocess.Popen([sys.executable, "-c", _BARE_LOOP])
        try:
            time.sleep(args.settle)
            pids = {p.name: p.pid for p in info.processes} | {"bare asyncio loop": bare.pid}
            rates = cpu_rates(pids, args.seconds)
        finally:
            bare.kill()
            bare.wait()
            launcher.down(root)
    baseline = rates.pop("bare asyncio loop")
    roles = {p.name: p.role for p in info.processes}
    by_role: dict[str, float] = defaultdict(float)
    for name, rate in rates.items():
        by_role[roles[name]] += rate
    total = round(sum(rates.values()), 1)
    result = {"total_ms_per_s": total, "share_of_box": round(total / 1e3 / 2, 3), "baseline_ms_per_s": baseline,
              "by_role": {role: round(rate, 1) for role, rate in sorted(by_role.items(), key=lambda r: -r[1])},
              "by_process": dict(sorted(rates.items(), key=lambda r: -r[1])), "seconds": args.seconds}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    top = ", ".join(f"{role} {rate:.0f}" for role, rate in list(result["by_role"].items())[:5])  # type: ignore[union-attr]
    print(f"idle default cluster: {total:.0f} ms CPU/s in all ({len(rates)} processes, {total / baseline:.0f}x a bare "
          f"asyncio loop's {baseline:.1f}); by role: {top}")


if __name__ == "__main__":
    main()
