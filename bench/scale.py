"""What the control plane costs per decision as the cluster grows: `--volumes` volumes on `--disks` disks.

Runs clustermgr's state machine in process (no Raft, no HTTP: what every replica does when it applies a command
or serves a read) on a temp RocksDB and times, in milliseconds: a scan of every volume (the /metrics tally, the
volume floor and the listings start with one), a volume allocation's apply, one blobnode's disk heartbeat apply
(`--disks-per-node` disks), the volume floor's count, what a reader that keeps volumes asks for when nothing
changed (the scheduler's every round), and the scheduler's planning of one round (units by disk, margins,
balance) over those volumes. The baseline measured in the same run is parsing every volume record out of
RocksDB, what each scan cost while the state held nothing in memory. Writes JSON and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.cluster import Unit, VolumeInfo
from blobstore_server.libs.proto.clustermgr import CodeModeRule, DiskAdd, DiskBeat
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.services.clustermgr.commands.disks import DiskAddCmd, DiskHeartbeatCmd
from blobstore_server.services.clustermgr.commands.keys import ScopeAlloc
from blobstore_server.services.clustermgr.commands.volumes import VolumeAllocCmd, VolumeCreate
from blobstore_server.services.clustermgr.machine import ClusterMachine
from blobstore_server.services.clustermgr.volumes import volumes_short
from blobstore_server.services.scheduler import rules
from tests.support.clustermgr_state import Driver

HEARTBEAT_TIMEOUT = 60.0
FLOOR = CodeModeRule(code_mode="EC3P3", min_volumes=4, min_idle_volumes=1)


def best_ms(fn: Callable[[], object], rounds: int) -> float:
    """The fastest of `rounds` calls, in ms: the box's noise only ever adds."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(min(times) * 1e3, 3)


def parse_every_volume(state: ClusterMachine) -> None:
    """What a scan cost before the state held volumes parsed: each record parsed, then dropped."""
    for _, raw in state.kv.items("volume"):
        VolumeInfo.model_validate_json(raw)


def plan_round(state: ClusterMachine) -> None:
    """The scheduler's decisions of one round over every volume and disk (its I/O left out)."""
    disks, volumes = list(state.disks()), list(state.volumes())
    placed = rules.units_by_disk(volumes)
    rules.volume_margins(volumes, {disks[0].disk_id})
    rules.plan_balance(disks, placed, [], time.time(), 2, 10)
    for disk in disks:
        rules.units_to_evacuate(disk, placed.get(disk.disk_id, []), {}, time.time())


def host(disk_id: int, per_node: int) -> str:
    node = (disk_id - 1) // per_node
    return f"http://10.{node // 250}.{node % 250}.1:8899"


def populate(cm: Driver, disks: int, per_node: int, volumes: int) -> None:
    cm(ScopeAlloc(name="disk_id", count=disks))
    for disk_id in range(1, disks + 1):
        cm(DiskAddCmd(disk=DiskAdd(disk_id=disk_id, host=host(disk_id, per_node), idc="z0",
                                   rack=f"r{disk_id // per_node % 20}", path=f"/d{disk_id % per_node}",
                                   size=1 << 44, free=1 << 44)))
    cm(ScopeAlloc(name="vid", count=volumes))
    for vid in range(1, volumes + 1):
        first = (vid * 7) % disks
        spread = [(first + i * per_node) % disks + 1 for i in range(6)]  # six nodes
        units = [Unit(vuid=Vuid.make(vid, i, 1), disk_id=d, host=host(d, per_node)) for i, d in enumerate(spread)]
        cm(VolumeCreate(vid=vid, code_mode=CodeMode.EC3P3, backend="isal", units=units,
                        capacity=1 << 36))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--volumes", type=int, default=10_000)
    parser.add_argument("--disks", type=int, default=1_200)
    parser.add_argument("--disks-per-node", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/scale.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cm-scale-") as tmp:
        state = ClusterMachine(Path(tmp) / "state", sync=False)
        try:
            cm = Driver(state)
            cm.now = time.time()
            populate(cm, args.disks, args.disks_per_node, args.volumes)
            holders = iter(range(1 << 30))
            beat = [DiskBeat(disk_id=d, size=1 << 44, free=1 << 43) for d in range(1, args.disks_per_node + 1)]
            figures = {
                "parse_every_volume_ms": best_ms(lambda: parse_every_volume(state), args.rounds),
                "scan_ms": best_ms(lambda: sum(1 for _ in state.volumes()), args.rounds),
                "volume_alloc_ms": best_ms(lambda: cm(VolumeAllocCmd(
                    code_mode=CodeMode.EC3P3, holder=f"h{next(holders)}", count=1, lease_ttl=60,
                    heartbeat_timeout=HEARTBEAT_TIMEOUT)), args.rounds),
                "disk_heartbeat_ms": best_ms(lambda: cm(DiskHeartbeatCmd(disks=beat)), args.rounds),
                "volume_floor_ms": best_ms(lambda: volumes_short(state, FLOOR, cm.now, HEARTBEAT_TIMEOUT), args.rounds),
                "volumes_changed_ms": best_ms(lambda: list(state.volumes_changed_since(cm.index)), args.rounds),
                "scheduler_round_ms": best_ms(lambda: plan_round(state), args.rounds),
            }
        finally:
            state.close()
    result = {"volumes": args.volumes, "disks": args.disks, **figures,
              "scan_ratio": round(figures["scan_ms"] / figures["parse_every_volume_ms"], 4)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"control plane at {args.volumes} volumes, {args.disks} disks: scan {figures['scan_ms']} ms"
          f" ({result['scan_ratio']}x of parsing every volume, {figures['parse_every_volume_ms']} ms),"
          f" volume alloc {figures['volume_alloc_ms']} ms, disk heartbeat of {args.disks_per_node} disks"
          f" {figures['disk_heartbeat_ms']} ms, volume floor {figures['volume_floor_ms']} ms, no changes"
          f" {figures['volumes_changed_ms']} ms, scheduler round {figures['scheduler_round_ms']} ms")


if __name__ == "__main__":
    main()
