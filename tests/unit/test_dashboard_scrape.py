"""The dashboard's arithmetic on scrapes (rates, restarts, latency quantiles) and its health verdict, on
exposition text written by prometheus-client itself."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.scheduler import TaskRecord, TaskState
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.services.dashboard.config import Target
from blobstore_server.services.dashboard.overview import TargetState, build_overview, task_views
from blobstore_server.services.dashboard.scrape import Scrape, quantile, rate, rate_point

BUCKETS = (0.001, 0.01, 0.1, 1.0)


class FakeAccess:
    """An access node's request metrics, in a registry of its own (the same families libs.rpc.metrics declares)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("blobstore_http_requests", "", ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("blobstore_http_request_duration_seconds", "", ["route", "method"],
                                 buckets=BUCKETS, registry=self.registry)

    def serve(self, route: str, method: str, seconds: float, times: int = 1) -> None:
        for _ in range(times):
            self.requests.labels(route, method, "200").inc()
            self.latency.labels(route, method).observe(seconds)

    def scrape(self, at: float) -> Scrape:
        return Scrape.parse(generate_latest(self.registry).decode(), at)


def test_rates_and_quantiles_over_one_interval() -> None:
    node = FakeAccess()
    node.serve("/blob", "PUT", 0.005, times=10)
    before = node.scrape(100.0)
    node.serve("/blob", "PUT", 0.005, times=18)  # in (0.001, 0.01]
    node.serve("/blob", "PUT", 0.5, times=2)  # in (0.1, 1.0]
    node.serve("/blob/{token}", "GET", 0.0005, times=40)
    after = node.scrape(102.0)
    point = rate_point([(before, after)])
    assert point.put_per_s == 10.0 and point.get_per_s == 20.0
    # 20 PUTs in the interval: the median is the 10th of 18 spread over (1 ms, 10 ms]
    assert point.put_p50_ms == pytest.approx(1 + 9 * 10 / 18, rel=1e-6)
    assert point.put_p99_ms == pytest.approx(100 + 900 * (19.8 - 18) / 2, rel=1e-6)
    assert point.get_p50_ms == pytest.approx(0.5)
    assert point.time == 102.0


def test_no_requests_means_no_latency_and_a_zero_rate() -> None:
    node = FakeAccess()
    node.serve("/blob", "PUT", 0.005)
    point = rate_point([(node.scrape(1.0), node.scrape(3.0))])
    assert (point.put_per_s, point.put_p50_ms, point.get_p99_ms) == (0.0, None, None)


def test_a_restarted_process_counts_from_zero_not_negative() -> None:
    old, new = FakeAccess(), FakeAccess()
    old.serve("/blob", "PUT", 0.005, times=50)
    new.serve("/blob", "PUT", 0.005, times=4)
    assert rate(old.scrape(0.0), new.scrape(2.0), "blobstore_http_requests_total") == 2.0


def test_rates_sum_over_access_nodes() -> None:
    a, b = FakeAccess(), FakeAccess()
    pairs = []
    for node, count in ((a, 6), (b, 2)):
        before = node.scrape(0.0)
        node.serve("/blob", "PUT", 0.05, times=count)
        pairs.append((before, node.scrape(2.0)))
    assert rate_point(pairs).put_per_s == 4.0


@pytest.mark.parametrize(("q", "expected"), [(0.0, 0.0), (0.25, 0.5), (0.5, 1.0), (0.75, 1.5), (1.0, 2.0)])
def test_quantile_interpolates_inside_a_bucket(q: float, expected: float) -> None:
    assert quantile(q, {1.0: 2, 2.0: 4, float("inf"): 4}) == pytest.approx(expected)


def test_quantile_beyond_the_last_bound_is_that_bound() -> None:
    assert quantile(0.99, {1.0: 1, float("inf"): 10}) == 1.0
    assert quantile(0.5, {}) is None
    assert quantile(0.5, {1.0: 0, float("inf"): 0}) is None


def _state(name: str, role: str, text: str | None) -> TargetState:
    state = TargetState(Target(name=name, role=role, url=f"http://{name}"))
    if text is None:
        state.failed("connection refused")
    else:
        state.scraped(Scrape.parse(text, 10.0))
    return state


def _disk(disk_id: int, host: str, status: DiskStatus = DiskStatus.NORMAL, alive: bool = True) -> DiskView:
    return DiskView(disk_id=disk_id, host=host, idc="z0", rack="r0", path=f"/d{disk_id}", status=status,
                    alive=alive, size=100, free=40)


LEADER = 'blobstore_raft_role{role="leader"} 1\nblobstore_raft_role{role="follower"} 0\nblobstore_raft_term 3\n' \
         'blobstore_clustermgr_volumes{status="active"} 2\n'
FOLLOWER = 'blobstore_raft_role{role="leader"} 0\nblobstore_raft_role{role="follower"} 1\nblobstore_raft_term 3\n'


def test_overview_of_a_healthy_cluster() -> None:
    states = [_state("cm1", "clustermgr", LEADER), _state("cm2", "clustermgr", FOLLOWER),
              _state("bn1", "blobnode", ""), _state("bn2", "blobnode", "")]
    disks = [_disk(2, "http://bn2"), _disk(1, "http://bn1"), _disk(3, "http://bn1")]
    overview = build_overview(states, disks, "", {"repair": 4}, [], 2.0)
    assert overview.healthy and overview.problems == []
    assert (overview.leader, overview.term) == ("cm1", 3)
    assert [(n.name, [d.disk_id for d in n.disks]) for n in overview.blobnodes] == [("bn1", [1, 3]), ("bn2", [2])]
    assert overview.volumes_by_status == {"active": 2} and overview.disks_by_status == {"normal": 3}
    assert {p.name: p.backlog for p in overview.backlog} == {"repair_prior": None, "repair": 4, "delete": None,
                                                                "reclaim": None}


def test_overview_names_what_is_wrong() -> None:
    states = [_state("cm1", "clustermgr", FOLLOWER), _state("bn1", "blobnode", None)]
    disks = [_disk(1, "http://bn1", DiskStatus.BROKEN), _disk(2, "http://bn1", alive=False)]
    overview = build_overview(states, disks, "", None, [], 2.0)
    assert not overview.healthy
    assert overview.problems == ["bn1 does not answer (connection refused)",
                                 "no clustermgr replica leads (no Raft leader)",
                                 "disk 1 on bn1 is broken", "disk 2 on bn1 misses its heartbeats"]
    assert overview.leader is None and not overview.blobnodes[0].up


def test_only_open_tasks_are_listed_oldest_first_and_bounded() -> None:
    def task(task_id: str, state: TaskState, ctime: float) -> TaskRecord:
        return TaskRecord(task_id=task_id, task_type=TaskType.DISK_REPAIR, state=state, disk_id=1, vid=1,
                          unit_index=0, source_vuid=1, ctime=ctime, mtime=ctime + 5, done_bytes=1, total_bytes=4)

    records = [task("c", TaskState.PREPARED, 30), task("a", TaskState.INITED, 10), task("done", TaskState.FINISHED, 0),
               task("b", TaskState.WORK_COMPLETED, 20), task("x", TaskState.FINISHED_IN_ADVANCE, 5)]
    views = task_views(records, now=100)
    assert [v.task_id for v in views] == ["a", "b", "c"]
    assert (views[0].age_s, views[0].idle_s, views[0].state) == (90.0, 85.0, "inited")
    assert [v.task_id for v in task_views(records, now=100, limit=2)] == ["a", "b"]


def test_disks_at_reduced_redundancy_show_their_countdown_or_eta_and_volumes_their_margin() -> None:
    scheduler = ('blobstore_scheduler_active 1\nblobstore_scheduler_volumes_at_margin{margin="0"} 1\n'
                 'blobstore_scheduler_volumes_at_margin{margin="2"} 5\n')
    states = [_state("cm1", "clustermgr", LEADER), _state("standby", "scheduler", "blobstore_scheduler_active 0\n"),
              _state("sched", "scheduler", scheduler), _state("bn1", "blobnode", "")]
    silent = _disk(1, "http://bn1", alive=False).model_copy(update={"last_heartbeat": 930.0})
    broken = _disk(2, "http://bn1", DiskStatus.REPAIRING)

    def repair(index: int, state: TaskState, done: int, total: int) -> TaskRecord:
        return TaskRecord(task_id=f"t{index}", task_type=TaskType.DISK_REPAIR, state=state, disk_id=2, vid=index,
                          unit_index=0, source_vuid=index, ctime=900.0, mtime=990.0, done_bytes=done,
                          total_bytes=total)

    tasks = [repair(1, TaskState.FINISHED, 400, 400), repair(2, TaskState.PREPARED, 200, 400),
             repair(3, TaskState.INITED, 0, 0)]
    overview = build_overview(states, [silent, broken], "", None, [], 2.0, tasks, now=1000.0, broken_after=120.0)
    rows = {d.disk_id: d.repair for d in overview.blobnodes[0].disks}
    assert rows[1] is not None and (rows[1].silent_s, rows[1].starts_in_s) == (70.0, 50.0)
    # 600 bytes moved in 100 s; 200 left of unit 2 and about 400 (the average unit) of unit 3
    assert rows[2] is not None and (rows[2].units_left, rows[2].eta_s) == (2, 100.0)
    assert overview.volumes_by_margin == {"0": 1, "2": 5}
    assert overview.problems[0] == "1 volume(s) at margin 0: the next loss loses blobs"
    off = build_overview(states, [silent], "", None, [], 2.0, [], now=1000.0, broken_after=None)
    assert off.blobnodes[0].disks[0].repair is not None and off.blobnodes[0].disks[0].repair.starts_in_s is None


def test_a_disk_shows_its_trash_and_a_scrub_its_cap_cannot_keep_is_a_problem() -> None:
    scrub = ('blobstore_blobnode_scrub_enabled{disk_id="1"} 1\nblobstore_blobnode_scrub_progress{disk_id="1"} 0.5\n'
             'blobstore_blobnode_scrub_late_seconds{disk_id="1"} 316800\n'
             'blobstore_blobnode_scrub_enabled{disk_id="2"} 1\nblobstore_blobnode_scrub_progress{disk_id="2"} 0.5\n'
             'blobstore_blobnode_scrub_late_seconds{disk_id="2"} 0\n')
    states = [_state("cm1", "clustermgr", LEADER), _state("bn1", "blobnode", scrub)]
    disks = [_disk(1, "http://bn1").model_copy(update={"trash_bytes": 7 << 30, "scrub_late_s": 316800.0}),
             _disk(2, "http://bn1")]
    overview = build_overview(states, disks, "", None, [], 2.0, now=10.0)
    rows = {d.disk_id: d for d in overview.blobnodes[0].disks}
    assert rows[1].trash_bytes == 7 << 30 and rows[2].trash_bytes == 0
    assert rows[1].scrub is not None and rows[1].scrub.late_s == 316800.0
    assert rows[2].scrub is not None and rows[2].scrub.late_s == 0.0
    assert overview.problems == ["disk 1 on bn1: its scrub pass ends 3.7 days past its period even at "
                                 "scrub_mb_per_sec (raise the cap or the period)"]
