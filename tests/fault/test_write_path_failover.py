"""No single point of failure on the write path: under a steady PUT stream through the SDK (every access URL),
each kind of process `cluster up` starts is killed -9 and restarted a few seconds later, as a supervisor would:
those on the write path (allocator, access node, blobnode, clustermgr leader, Kafka) one at a time, the
background ones (scheduler, worker, mqproxy, tinker, Redis, dashboard) all at once; every allocator and every
clustermgr are killed at once for 30 s. Each kill's failed PUTs are reported: an allocator's or an access
node's may be none, any other's at most 0.1%; every acknowledged object reads back. One real cluster."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from blobstore_server.cluster import launcher
from blobstore_server.cluster.launcher import ClusterInfo
from tests.support.launched import Launch
from tests.support.load import PutStream, failures, put_stream, read_back, success_rate
from tests.support.processes import wait_until

DOWN = 6.0  # seconds a killed allocator or access node stays down before its supervisor restarts it
DOWN_OTHER = 3.0  # any other process: what its kill costs shows at once (bench/availability.py --roles: 10 s)
OUTAGE = 30.0  # seconds every allocator stays down
SETTLE = 1.0  # seconds of the stream counted after a restart
WRITE_PATH = ("allocator", "access")  # stateless and doubled: a kill of one costs no PUT at all
BACKGROUND = ("scheduler", "worker", "mqproxy", "tinker", "redis", "dashboard")  # no PUT waits on them
# The launched `cluster` (tests/conftest.py): the default shape, its own (its processes are killed and restarted)
LAUNCH = Launch(timeout=120.0, owner=__name__)
WRITERS = 2  # SDK clients writing at once: a steady stream of ~50 PUTs/s here


def kill9(root: Path, name: str) -> None:
    record = next(p for p in ClusterInfo.load(root).processes if p.name == name)
    os.kill(record.pid, signal.SIGKILL)
    wait_until(lambda: not record.running, 10, f"{name} to die")


def through(stream: PutStream, groups: list[list[str]], root: Path, down: float) -> tuple[int, int]:
    """Kill every process of `groups`, restart them `down` s later, a group at a time (side by side within one),
    and count (PUTs begun meanwhile until SETTLE s after, failed)."""
    stream.wait_for(20, time.monotonic())
    began = time.monotonic()
    kill = [name for group in groups for name in group]
    for name in kill:
        kill9(root, name)
    time.sleep(down)
    for group in groups:
        launcher.restart(root, *group, timeout=120.0)
    time.sleep(SETTLE)
    window = stream.since(began, time.monotonic())
    assert window, f"no PUT began while {kill} were down"
    return len(window), sum(not a.ok for a in window)


def test_every_allocator_and_every_clustermgr_down_for_30_s_costs_under_1_percent(cluster: ClusterInfo) -> None:
    """Access writes on the space and the volume information it holds; clustermgr is restarted first (the
    allocators lease from it)."""
    root = Path(cluster.dir)
    victims = [[p.name for p in cluster.processes if p.role == role] for role in ("clustermgr", "allocator")]
    assert [len(group) for group in victims] == [3, 2]
    with put_stream(cluster.access_urls, writers=WRITERS) as stream:
        time.sleep(6)  # a steady stream: the standby stock is sized from its rate (and refilled every 2 s)
        began = time.monotonic()
        total, failed = through(stream, victims, root, OUTAGE)
    print(f"every allocator and clustermgr down {OUTAGE:.0f} s: {failed} of {total} PUTs failed")
    assert failed <= total * 0.01, (total, failed, failures(stream.since(began)))
    assert read_back(cluster.access_urls, stream.acked) == []


@pytest.mark.timeout(600)
def test_each_kind_of_process_killed_in_turn(cluster: ClusterInfo) -> None:
    root = Path(cluster.dir)
    by_role: dict[str, list[str]] = {}
    for process in cluster.processes:
        by_role.setdefault(process.role, []).append(process.name)
    assert {"allocator", "access", "blobnode", "clustermgr", "scheduler", "worker", "mqproxy", "tinker", "kafka",
            "redis", "dashboard"} <= set(by_role)
    # One of each kind (every allocator was down at once above), of clustermgr its leader.
    victims = [(role, names[0]) for role, names in by_role.items() if role not in BACKGROUND]
    background = [names[0] for role, names in by_role.items() if role in BACKGROUND]
    report: dict[str, tuple[int, int]] = {}
    with put_stream(cluster.access_urls, writers=WRITERS) as stream:
        stream.wait_for(100)
        began = time.monotonic()
        for role, name in victims:
            if role == "clustermgr":
                name = launcher.status(root).leader or name
            report[name] = through(stream, [[name]], root, DOWN if role in WRITE_PATH else DOWN_OTHER)
        report["+".join(background)] = through(stream, [background], root, DOWN_OTHER)
        whole = stream.since(began)
    print("failed PUTs per kill:", {name: f"{failed}/{total}" for name, (total, failed) in report.items()})
    write_path = {name: report[name] for role, name in victims if role in WRITE_PATH}
    assert all(failed == 0 for _, failed in write_path.values()), (write_path, failures(whole))
    assert all(failed <= total * 0.001 for total, failed in report.values()), (report, failures(whole))
    assert success_rate(whole) >= 0.999, (report, failures(whole))
    assert read_back(cluster.access_urls, stream.acked) == []
