"""A region: `blobstore cluster up --clusters 2` (real processes), PUTs spread by free space."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blobstore import Client, NotFound
from blobstore.cli import app
from blobstore.launcher import ClusterInfo, down, up
from blobstore.plan import ClusterShape
from blobstore.procs import free_port
from services.clustermgr.client import ClusterClient
from tests.support.processes import Service, stop_all, wait_until


@pytest.fixture
def region(tmp_path: Path) -> Iterator[ClusterInfo]:
    root = tmp_path / "region"
    try:
        yield up(root, ClusterShape(blobnodes=6, disks_per_node=1, min_volumes=4, delete_delay=1.0, clusters=2),
                 timeout=120)
    finally:
        if (root / "cluster.json").exists():
            down(root)


def _set_readonly(urls: list[str], count: int) -> None:
    """Mark `count` of the cluster's disks read-only: no new volume goes there, as on a full disk."""
    async def mark() -> None:
        async with ClusterClient(urls) as cm:
            for disk in sorted(await cm.list_disks(), key=lambda d: d.disk_id)[:count]:
                await cm.set_disk(disk.disk_id, readonly=True)

    asyncio.run(mark())


def _put_many(client: Client, count: int) -> dict[str, bytes]:
    return {client.put(body): body for body in (f"object {i} {time.time()}".encode() for i in range(count))}


def test_puts_spread_by_free_space_and_every_object_reads_and_deletes_through_any_access_node(
        region: ClusterInfo, tmp_path: Path) -> None:
    status = json.loads(CliRunner().invoke(app, ["cluster", "status", "--json", "--dir", region.dir]).stdout)
    assert set(status["leaders"]) == {"1", "2"} and all(status["leaders"].values())
    _set_readonly(region.region["2"], 3)  # cluster 2 keeps 3 writable disks of 6: half cluster 1's space
    time.sleep(3.0)  # access looks at free space every 2 s

    with Client(region.access_url) as client:
        stored = _put_many(client, 150)
        by_cluster = Counter(client.stat(location).cluster_id for location in stored)
    assert set(by_cluster) == {1, 2}
    assert 25 <= by_cluster[2] <= 75, by_cluster  # expected 50 of 150 (1/3); 4 standard deviations either way

    # A second access node of the region (the same config on another port) reads and deletes all of them.
    conf = json.loads((Path(region.dir) / "access" / "conf.json").read_text())
    port = free_port()
    workdir = tmp_path / "access2"
    workdir.mkdir()
    other = Service("services.access", {**conf, "bind_addr": f"127.0.0.1:{port}",
                                        "audit_log": "", "orphan_log": str(workdir / "orphans.jsonl")},
                    workdir, f"http://127.0.0.1:{port}").start()
    try:
        with Client(other.url) as client:
            assert all(client.get(location) == body for location, body in stored.items())
            doomed = [loc for loc in stored if client.stat(loc).cluster_id == 2][:3] + [
                loc for loc in stored if client.stat(loc).cluster_id == 1][:3]
            for location in doomed:
                client.delete(location)

            def all_gone() -> bool:
                for location in doomed:
                    try:
                        client.get(location)
                        return False
                    except NotFound:
                        pass
                return True

            wait_until(all_gone, 30, "deleted objects of both clusters unreadable", interval=0.5)
    finally:
        stop_all([other])

    _set_readonly(region.region["2"], 6)  # no writable space left in cluster 2: it takes no more PUTs
    time.sleep(3.0)
    with Client(region.access_url) as client:
        assert {client.stat(loc).cluster_id for loc in _put_many(client, 40)} == {1}
