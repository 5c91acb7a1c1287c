"""The dashboard API: one overview of the cluster, what its page draws (GET /api/overview)."""

from __future__ import annotations

from pydantic import BaseModel


class ProcessView(BaseModel):
    name: str
    role: str
    url: str
    up: bool  # its /metrics answered at the last scrape
    error: str = ""  # why not, when it did not
    requests_per_s: float = 0.0
    in_flight: int = 0
    cpu_percent: float | None = None  # of one core, over the last scrape interval
    insecure: bool = False  # runs without auth (`insecure: true`; its blobstore_insecure metric is 1)


class ScrubView(BaseModel):
    """A disk's scrub, from its blobnode's metrics (blobstore_blobnode_scrub_*)."""

    progress: float  # of the current pass (1 between passes)
    last_pass_age_s: float | None  # since the last full pass ended; None: none yet
    corrupt: int  # shards found corrupt or unreadable, since the blobnode's record began
    repairs_owed: int  # findings mqproxy has not taken yet
    late_s: float = 0.0  # past its period the pass ends even at the blobnode's cap (0: on time)


class RepairView(BaseModel):
    """A disk at reduced redundancy: silent (the unattended repair starts in `starts_in_s`) or being repaired
    (`units_left` units to rebuild, done in about `eta_s`)."""

    silent_s: float | None = None  # since its last heartbeat, while it is silent
    starts_in_s: float | None = None  # until the scheduler declares it broken; None: unattended repair is off
    units_left: int = 0  # repair tasks not finished
    eta_s: float | None = None  # at the rate of its repair so far; None: not started, or nothing moved yet


class DiskRow(BaseModel):
    disk_id: int
    path: str
    status: str  # normal, broken, repairing, ...
    readonly: bool
    alive: bool  # its blobnode heartbeats
    size: int
    free: int
    trash_bytes: int = 0  # in its .trash/, removed after its blobnode's trash_hold
    chunks: int
    scrub: ScrubView | None = None  # None: its blobnode was not scraped, or does not scrub
    repair: RepairView | None = None  # None: heard from and normal


class BlobnodeView(BaseModel):
    name: str
    host: str
    up: bool
    disks: list[DiskRow]


class ReplicaView(BaseModel):
    name: str
    up: bool
    role: str
    term: int
    commit: int
    applied: int


class PipelineView(BaseModel):
    """One of tinker's pipelines: its backlog in Kafka and what tinker did with its messages."""

    name: str
    backlog: int | None  # messages not yet committed by its consumer group; None: unknown
    messages_in: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0


class RatePoint(BaseModel):
    """PUT and GET through every access node over one scrape interval ending at `time`."""

    time: float
    put_per_s: float
    get_per_s: float
    put_p50_ms: float | None = None  # None: no request of that kind in the interval
    put_p99_ms: float | None = None
    get_p50_ms: float | None = None
    get_p99_ms: float | None = None


class TaskView(BaseModel):
    """A background task not finished yet (disk repair, drop, balance, migrate), from its record."""

    task_type: str
    task_id: str
    state: str
    disk_id: int
    vid: int
    done_bytes: int
    total_bytes: int
    done_shards: int
    total_shards: int
    age_s: float  # since it was created
    idle_s: float  # since its state or progress last changed


class Overview(BaseModel):
    updated: float  # when the last scrape finished (unix time; 0: none yet)
    scrape_interval: float
    healthy: bool
    problems: list[str]
    leader: str | None
    term: int
    processes: list[ProcessView]
    blobnodes: list[BlobnodeView]
    volumes_by_status: dict[str, int]
    disks_by_status: dict[str, int]
    replicas: list[ReplicaView]
    backlog: list[PipelineView]
    series: list[RatePoint]
    tasks: list[TaskView] = []  # open tasks, oldest first (at most MAX_TASKS)
    open_tasks: int = 0  # all of them
    # volumes with a lost unit by how many more losses they take (0: one more loses blobs), from the scheduler
    volumes_by_margin: dict[str, int] = {}
    insecure: list[str] = []  # processes running without auth, named in the page's red INSECURE badge
