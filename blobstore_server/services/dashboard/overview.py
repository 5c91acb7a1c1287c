"""The cluster overview the page draws, assembled from the last scrapes, clustermgr's disk table and
the backlog, free of I/O; and the health verdict: what a person should look at first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from blobstore_server.libs.mq.topics import PIPELINE_TOPICS
from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.dashboard import (
    BlobnodeView,
    DiskRow,
    Overview,
    PipelineView,
    ProcessView,
    RatePoint,
    RepairView,
    ReplicaView,
    ScrubView,
    TaskView,
)
from blobstore_server.libs.proto.scheduler import URGENT_MARGIN, TaskRecord
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.services.dashboard.config import Target
from blobstore_server.services.dashboard.scrape import (
    CPU_SECONDS,
    IN_FLIGHT,
    INSECURE,
    PIPELINE_COUNTERS,
    RAFT_APPLIED,
    RAFT_COMMIT,
    RAFT_ROLE,
    RAFT_TERM,
    REQUESTS,
    SCHEDULER_ACTIVE,
    SCRUB_CORRUPT,
    SCRUB_ENABLED,
    SCRUB_LAST_PASS,
    SCRUB_LATE,
    SCRUB_PROGRESS,
    SCRUB_REPAIRS_OWED,
    VOLUMES,
    VOLUMES_AT_MARGIN,
    Scrape,
    rate,
)

MAX_TASKS = 50  # rows of the running-tasks table


@dataclass
class TargetState:
    """What the dashboard knows of one process: its last two scrapes, or why the last one failed."""

    target: Target
    previous: Scrape | None = None
    latest: Scrape | None = None
    error: str = "not scraped yet"

    def scraped(self, scrape: Scrape) -> None:
        self.previous, self.latest, self.error = self.latest, scrape, ""

    def failed(self, error: str) -> None:
        self.previous, self.latest, self.error = None, None, error

    @property
    def up(self) -> bool:
        return self.latest is not None


def process_view(state: TargetState) -> ProcessView:
    view = ProcessView(name=state.target.name, role=state.target.role, url=state.target.url, up=state.up,
                       error=state.error)
    if state.latest is not None:
        # less the scrape itself, which is in flight while the process counts
        view.in_flight = max(0, int(state.latest.total(IN_FLIGHT)) - 1)
        view.insecure = bool(state.latest.value(INSECURE))
    if state.previous is not None and state.latest is not None:
        view.requests_per_s = round(rate(state.previous, state.latest, REQUESTS), 2)
        view.cpu_percent = round(100 * rate(state.previous, state.latest, CPU_SECONDS), 1)
    return view


def replica_view(state: TargetState) -> ReplicaView:
    scrape = state.latest
    if scrape is None:
        return ReplicaView(name=state.target.name, up=False, role="unknown", term=0, commit=0, applied=0)
    return ReplicaView(name=state.target.name, up=True,
                       role=scrape.label_where(RAFT_ROLE, "role", 1.0) or "unknown",
                       term=int(scrape.value(RAFT_TERM) or 0),
                       commit=int(scrape.value(RAFT_COMMIT) or 0),
                       applied=int(scrape.value(RAFT_APPLIED) or 0))


def scrub_view(scrape: Scrape | None, disk_id: int, now: float) -> ScrubView | None:
    """A disk's scrub from its blobnode's last scrape; None without one, or when the disk does not scrub."""
    if scrape is None:
        return None
    disk = str(disk_id)
    progress = scrape.value(SCRUB_PROGRESS, disk_id=disk)
    if progress is None or not scrape.value(SCRUB_ENABLED, disk_id=disk):
        return None
    last = scrape.value(SCRUB_LAST_PASS, disk_id=disk) or 0.0
    return ScrubView(progress=progress, last_pass_age_s=round(max(0.0, now - last), 1) if last else None,
                     corrupt=int(scrape.total(SCRUB_CORRUPT, disk_id=disk)),
                     repairs_owed=int(scrape.total(SCRUB_REPAIRS_OWED, disk_id=disk)),
                     late_s=scrape.value(SCRUB_LATE, disk_id=disk) or 0.0)


def repair_view(disk: DiskView, tasks: Sequence[TaskRecord], broken_after: float | None,
                now: float) -> RepairView | None:
    """A silent disk's countdown to its unattended repair, or a broken one's units left and time to go: bytes
    left over the rate its repair moved bytes so far (a unit not listed yet counts as the average of the others)."""
    if disk.status is DiskStatus.NORMAL:
        if disk.alive or not disk.last_heartbeat:
            return None
        silent = max(0.0, now - disk.last_heartbeat)
        starts = None if broken_after is None else round(max(0.0, broken_after - silent), 1)
        return RepairView(silent_s=round(silent, 1), starts_in_s=starts)
    if disk.status not in (DiskStatus.BROKEN, DiskStatus.REPAIRING):
        return None
    mine = [t for t in tasks if t.disk_id == disk.disk_id and t.task_type is TaskType.DISK_REPAIR]
    left = [t for t in mine if t.open]
    sized = [t.total_bytes for t in mine if t.total_bytes]
    average = sum(sized) / len(sized) if sized else 0.0
    bytes_left = sum(max(0, t.total_bytes - t.done_bytes) if t.total_bytes else average for t in left)
    done = sum(t.done_bytes for t in mine)
    elapsed = now - min((t.ctime for t in mine), default=now)
    eta = round(bytes_left * elapsed / done, 1) if done and elapsed > 0 else None
    return RepairView(units_left=len(left), eta_s=eta if left else 0.0)


def blobnode_views(states: Sequence[TargetState], disks: Sequence[DiskView], now: float = 0.0,
                   tasks: Sequence[TaskRecord] = (), broken_after: float | None = None) -> list[BlobnodeView]:
    """Every blobnode target with its disks (the watcher makes each host of the disk table a target)."""
    by_host: dict[str, list[DiskView]] = {}
    for disk in disks:
        by_host.setdefault(disk.host.rstrip("/"), []).append(disk)
    views = []
    for state in states:
        host = state.target.url.rstrip("/")
        rows = [DiskRow(disk_id=d.disk_id, path=d.path, status=d.status.value, readonly=d.readonly, alive=d.alive,
                        size=d.size, free=d.free, trash_bytes=d.trash_bytes, chunks=d.chunks,
                        scrub=scrub_view(state.latest, d.disk_id, now),
                        repair=repair_view(d, tasks, broken_after, now))
                for d in sorted(by_host.get(host, []), key=lambda d: d.disk_id)]
        views.append(BlobnodeView(name=state.target.name, host=host, up=state.up, disks=rows))
    return views


def pipeline_views(tinker: TargetState | None, backlog: Mapping[str, int] | None) -> list[PipelineView]:
    views = []
    for name in PIPELINE_TOPICS:
        view = PipelineView(name=name, backlog=None if backlog is None else backlog.get(name))
        scrape = tinker.latest if tinker is not None else None
        if scrape is not None:
            view.messages_in, view.done, view.failed, view.retried = (
                int(scrape.total(counter, pipeline=name)) for counter in PIPELINE_COUNTERS.values())
        views.append(view)
    return views


def task_views(records: Sequence[TaskRecord], now: float, limit: int = MAX_TASKS) -> list[TaskView]:
    """The open tasks, oldest first."""
    running = sorted((r for r in records if r.open), key=lambda r: (r.ctime, r.task_id))[:limit]
    return [TaskView(task_type=r.task_type.value, task_id=r.task_id, state=r.state.value, disk_id=r.disk_id,
                     vid=r.vid, done_bytes=r.done_bytes, total_bytes=r.total_bytes, done_shards=r.done_shards,
                     total_shards=r.total_shards, age_s=round(max(0.0, now - r.ctime), 1),
                     idle_s=round(max(0.0, now - r.mtime), 1)) for r in running]


def volumes_by_margin(schedulers: Sequence[TargetState]) -> dict[str, int]:
    """The active scheduler's count of volumes with a lost unit, by margin."""
    for state in schedulers:
        scrape = state.latest
        if scrape is not None and scrape.value(SCHEDULER_ACTIVE):
            return {labels["margin"]: int(n) for labels, n in scrape.matching(VOLUMES_AT_MARGIN)}
    return {}


def duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def problems(processes: Sequence[ProcessView], replicas: Sequence[ReplicaView], blobnodes: Sequence[BlobnodeView],
             cluster_error: str, margins: Mapping[str, int] | None = None) -> list[str]:
    """What is wrong, most pressing first: volumes one loss from losing blobs, processes down, no Raft leader,
    disks not normal or silent, disks whose scrub cannot keep its period."""
    found = [f"{n} volume(s) at margin {margin}: " + ("the next loss loses blobs" if margin == "0" else
                                                       "one loss from margin 0")
             for margin, n in sorted((margins or {}).items()) if int(margin) <= URGENT_MARGIN and n]
    found += [f"{p.name} does not answer ({p.error})" for p in processes if not p.up]
    if replicas and not any(r.role == "leader" for r in replicas):
        found.append("no clustermgr replica leads (no Raft leader)")
    if cluster_error:
        found.append(f"clustermgr: {cluster_error}")
    for node in blobnodes:
        for disk in node.disks:
            if disk.status != DiskStatus.NORMAL:
                found.append(f"disk {disk.disk_id} on {node.name} is {disk.status}")
            elif not disk.alive:
                found.append(f"disk {disk.disk_id} on {node.name} misses its heartbeats")
    found += [f"disk {disk.disk_id} on {node.name}: its scrub pass ends {duration(disk.scrub.late_s)} past its "
              "period even at scrub_mb_per_sec (raise the cap or the period)"
              for node in blobnodes for disk in node.disks if disk.scrub is not None and disk.scrub.late_s > 0]
    return found


def build_overview(states: Sequence[TargetState], disks: Sequence[DiskView], cluster_error: str,
                   backlog: Mapping[str, int] | None, series: Sequence[RatePoint], scrape_interval: float,
                   tasks: Sequence[TaskRecord] = (), now: float = 0.0, broken_after: float | None = None) -> Overview:
    roles: dict[str, list[TargetState]] = {}
    for state in states:
        roles.setdefault(state.target.role, []).append(state)
    processes = [process_view(s) for s in states]
    replicas = [replica_view(s) for s in roles.get("clustermgr", [])]
    blobnodes = blobnode_views(roles.get("blobnode", []), disks, now, tasks, broken_after)
    margins = volumes_by_margin(roles.get("scheduler", []))
    leader = next((r for r in replicas if r.role == "leader"), None)
    leader_scrape = next((s.latest for s in roles.get("clustermgr", []) if leader and s.target.name == leader.name),
                         None)
    volumes = {} if leader_scrape is None else {
        labels["status"]: int(v) for labels, v in leader_scrape.matching(VOLUMES)}
    disk_counts: dict[str, int] = {}
    for disk in disks:
        disk_counts[disk.status.value] = disk_counts.get(disk.status.value, 0) + 1
    found = problems(processes, replicas, blobnodes, cluster_error, margins)
    updated = max((s.latest.time for s in states if s.latest is not None), default=0.0)
    return Overview(updated=updated, scrape_interval=scrape_interval, healthy=not found, problems=found,
                    leader=leader.name if leader else None, term=max((r.term for r in replicas), default=0),
                    processes=processes, blobnodes=blobnodes, volumes_by_status=volumes, disks_by_status=disk_counts,
                    replicas=replicas, backlog=pipeline_views(next(iter(roles.get("tinker", [])), None), backlog),
                    series=list(series), tasks=task_views(tasks, now),
                    open_tasks=sum(r.open for r in tasks), volumes_by_margin=margins,
                    insecure=[p.name for p in processes if p.insecure])
