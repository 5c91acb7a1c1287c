"""`blobstore task list|switch|switches`, `blobstore disk drop|repair-progress` and `blobstore volume migrate`:
the scheduler's background tasks as an operator sees and steers them.

Imported by cli/cli.py once its shared options and helpers exist. Task records are read from
clustermgr's kv (so they show while no scheduler runs); a manual migration asks the active scheduler.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from blobstore_server.cli.cli_common import CmOpt, DirOpt, JsonOpt, disk_app, emit, on_cluster, out, volume_app
from blobstore_server.cluster.launcher import DEFAULT_DIR
from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.scheduler import TASK_PREFIX, ManualMigrate, TaskRecord, disk_progress
from blobstore_server.libs.proto.switches import OFF, ON, TaskType, switch_key, switch_states
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.scheduler.client import SchedulerClient

task_app = typer.Typer(help="Background tasks (disk repair, drop, balance, migrate): records and switches.",
                       no_args_is_help=True, pretty_exceptions_show_locals=False)


async def _records(cm: ClusterClient) -> list[TaskRecord]:
    return sorted((TaskRecord.model_validate_json(raw) for raw in (await cm.kv_list(TASK_PREFIX)).values()),
                  key=lambda t: t.ctime)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@task_app.command("list")
def task_list(as_json: JsonOpt = False, all_: Annotated[bool, typer.Option("--all", help="Finished ones too.")] = False,
              dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Background tasks, oldest first: type, state, disk, volume and unit, progress, age."""
    tasks = [t for t in on_cluster(dir, clustermgr, _records) if all_ or t.open]
    if as_json:
        emit([t.model_dump(mode="json") for t in tasks], True)
        return
    now = time.time()
    emit([{"task": t.task_id, "type": t.task_type.value, "state": t.state.value, "disk": t.disk_id,
            "vid": t.vid, "unit": t.unit_index, "to disk": t.destination.disk_id if t.destination else "",
            "progress": f"{_size(t.done_bytes)} / {_size(t.total_bytes)}, {t.done_shards}/{t.total_shards} shards",
            "age": f"{now - t.ctime:.0f}s", "note": t.reason} for t in tasks], False)


@task_app.command("switch")
def task_switch(name: TaskType, state: Annotated[str, typer.Argument(help="on or off")],
                dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Turn a background task type on or off (tinker and the scheduler notice within seconds)."""
    if state not in (ON, OFF):
        raise typer.BadParameter(f"{state!r}: say on or off", param_hint="STATE")
    on_cluster(dir, clustermgr, lambda cm: cm.set_config(switch_key(name), state))
    out.print(f"{name.value} switched {state}")


@task_app.command("switches")
def task_switches(as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Every task type and whether it is switched on."""
    states = switch_states(on_cluster(dir, clustermgr, lambda cm: cm.list_config()))
    if as_json:
        typer.echo(json.dumps({task.value: ON if on else OFF for task, on in states.items()}, indent=2))
        return
    emit([{"task": task.value, "switch": ON if on else OFF} for task, on in states.items()], False)


@disk_app.command("repair-progress")
def disk_repair_progress(disk_id: int, as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR,
                         clustermgr: CmOpt = "") -> None:
    """How far the repair (or drop) of a disk has come: units moved, bytes done, rate and time left."""
    async def read(cm: ClusterClient) -> tuple[DiskStatus, list[TaskRecord]]:
        return (await cm.get_disk(disk_id)).status, await _records(cm)

    status, tasks = on_cluster(dir, clustermgr, read)
    progress = disk_progress(tasks, disk_id, time.time())
    if as_json:
        typer.echo(json.dumps({"status": status.value, **progress.model_dump(mode="json")}, indent=2))
        return
    eta = "unknown yet" if progress.eta_seconds is None else f"{progress.eta_seconds:.0f}s"
    out.print(f"disk {disk_id} is {status.value}: {progress.finished}/{progress.tasks} units moved, "
              f"{_size(progress.done_bytes)} of {_size(progress.total_bytes)} "
              f"({progress.done_shards}/{progress.total_shards} shards), {_size(progress.bytes_per_sec)}/s, "
              f"time left {eta}")


@disk_app.command("drop")
def disk_drop(disk_id: int, dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Empty a disk for good: it takes no new chunk, every unit is copied elsewhere, then it is dropped."""
    async def drop(cm: ClusterClient) -> DiskStatus:
        await cm.set_disk(disk_id, readonly=True)
        return (await cm.set_disk(disk_id, status=DiskStatus.DROPPING)).status

    status = on_cluster(dir, clustermgr, drop)
    out.print(f"disk {disk_id} is {status.value}; follow it with: blobstore disk repair-progress {disk_id}")


@volume_app.command("migrate")
def volume_migrate(vid: int, index: int, to: Annotated[int | None, typer.Option(
        "--to", help="The destination disk [default: the placement policy chooses].")] = None,
                   dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Move unit INDEX of volume VID to another disk (copied, rebuilt where the copy fails)."""
    async def ask(cm: ClusterClient) -> TaskRecord:
        async with SchedulerClient(cm) as scheduler:
            return await scheduler.manual_migrate(ManualMigrate(vid=vid, index=index, disk_id=to))

    task = on_cluster(dir, clustermgr, ask)
    out.print(f"task {task.task_id} queued; follow it with: blobstore task list")
