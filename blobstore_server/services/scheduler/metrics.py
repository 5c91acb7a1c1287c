"""The scheduler's figures, read from its task table at scrape time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import Metric

from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc.metrics import counter, gauge
from blobstore_server.services.scheduler.scheduler import Scheduler


def scheduler_figures(scheduler: Scheduler) -> Iterator[Metric]:
    machine = scheduler.state
    yield gauge("blobstore_scheduler_active", "1 on the elected scheduler, 0 on a standby", int(scheduler.active))
    yield gauge("blobstore_scheduler_switch", "1 for each kind of task switched on as this scheduler last read the "
                "switches, 0 for one switched off", [((t.value,), int(machine.switches.is_on(t))) for t in TaskType],
                ["type"])
    counts = Counter((t.task_type.value, t.state.value) for t in machine.tasks.values())
    yield gauge("blobstore_scheduler_tasks", "Task records held by the active scheduler, by type and state",
                [((task_type, state), n) for (task_type, state), n in sorted(counts.items())], ["type", "state"])
    yield gauge("blobstore_scheduler_task_bytes", "Bytes done and to do of the open tasks, by type",
                [((t, kind), sum(getattr(task, f"{kind}_bytes") for task in machine.tasks.values()
                                 if task.open and task.task_type.value == t))
                 for t in sorted({task.task_type.value for task in machine.tasks.values()})
                 for kind in ("done", "total")], ["type", "kind"])
    margins = Counter(machine.margins.values())
    yield gauge("blobstore_scheduler_volumes_at_margin", "Volumes with a lost unit, by how many more losses they can "
                "take (0: one more and blobs are gone); on the active scheduler",
                [((str(margin),), n) for margin, n in sorted(margins.items())], ["margin"])
    yield counter("blobstore_scheduler_rounds", "Rounds over disks and tasks this scheduler completed while active",
                  scheduler.rounds)
    yield counter("blobstore_scheduler_fenced", "Requests refused for a superseded lease epoch: this scheduler's by "
                  "clustermgr, workers' by this scheduler", machine.fenced)
    stats = scheduler.inspector.stats
    yield counter("blobstore_scheduler_inspected_volumes", "Volumes whose units were compared", stats.volumes)
    yield counter("blobstore_scheduler_inspect_repairs", "Blobs sent to repair", stats.repairs_queued)
    yield counter("blobstore_scheduler_inspect_lost_blobs", "Blobs found with fewer than N shards", stats.lost_blobs)
