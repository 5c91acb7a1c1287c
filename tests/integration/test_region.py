"""A region: `blobstore cluster up --clusters 2` (real processes: two allocators per cluster, two access nodes
serving both clusters), PUTs spread by free space."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from blobstore import Client, NotFound
from blobstore_server.cli.cli import app
from blobstore_server.cluster.launcher import ClusterInfo
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.launched import Launch
from tests.support.metrics import sample
from tests.support.processes import wait_until

# The launched `cluster` (tests/conftest.py): a region of two clusters
LAUNCH = Launch(ClusterShape(blobnodes=6, disks_per_node=1, min_volumes=4, delete_delay=1.0, clusters=2),
                timeout=120, owner=__name__)


def _set_readonly(urls: list[str], count: int) -> None:
    """Mark `count` of the cluster's disks read-only: no new volume goes there, as on a full disk."""
    async def mark() -> None:
        async with ClusterClient(urls) as cm:
            for disk in sorted(await cm.list_disks(), key=lambda d: d.disk_id)[:count]:
                await cm.set_disk(disk.disk_id, readonly=True)

    asyncio.run(mark())


def _wait_until_every_access_node_sees(cluster: ClusterInfo, condition: Callable[[dict[str, float]], bool],
                                       what: str) -> None:
    """Until each access node's last look at the clusters' free space (every `region_refresh` s) meets `condition`."""
    def seen(url: str) -> dict[str, float]:
        return {cid: sample(url, "blobstore_access_region_free_bytes", {"cluster_id": cid}) for cid in ("1", "2")}

    wait_until(lambda: all(condition(seen(url)) for url in cluster.access_urls), 30, what, interval=0.5)


def _put_many(client: Client, count: int) -> dict[str, bytes]:
    return {client.put(body): body for body in (f"object {i} {time.time()}".encode() for i in range(count))}


def _assert_every_access_node_knows_every_allocator_of_each_cluster(cluster: ClusterInfo) -> None:
    allocators = {k: [p.url for p in cluster.processes if p.role == "allocator" and p.name.startswith(prefix)]
                  for k, prefix in ((1, "allocator"), (2, "c2-allocator"))}
    assert [len(urls) for urls in allocators.values()] == [2, 2]
    assert [p.name for p in cluster.processes if p.role == "access"] == ["access1", "access2"]
    for name in ("access1", "access2"):
        conf = json.loads((Path(cluster.dir) / name / "conf.json").read_text())
        assert conf["allocator_hosts"] == allocators[1]
        assert [(r["cluster_id"], r["allocator_hosts"]) for r in conf["region"]] == [(2, allocators[2])]


def test_puts_spread_by_free_space_and_every_object_reads_and_deletes_through_any_access_node(
        cluster: ClusterInfo) -> None:
    _assert_every_access_node_knows_every_allocator_of_each_cluster(cluster)  # not a test of its own: a region each
    status = json.loads(CliRunner().invoke(app, ["cluster", "status", "--json", "--dir", cluster.dir]).stdout)
    assert set(status["leaders"]) == {"1", "2"} and all(status["leaders"].values())
    _set_readonly(cluster.region["2"], 3)  # cluster 2 keeps 3 writable disks of 6: half cluster 1's space
    _wait_until_every_access_node_sees(cluster, lambda free: 0 < free["2"] < 0.75 * free["1"], "cluster 2 half full")

    first, second = cluster.access_urls  # access1 and access2, both serving the whole region
    with Client([first]) as client:
        stored = _put_many(client, 150)
        by_cluster = Counter(client.stat(location).cluster_id for location in stored)
    assert set(by_cluster) == {1, 2}
    assert 25 <= by_cluster[2] <= 75, by_cluster  # expected 50 of 150 (1/3); 4 standard deviations either way

    # The other access node reads and deletes what the first one stored, in either cluster.
    with Client([second]) as client:
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

    _set_readonly(cluster.region["2"], 6)  # no writable space left in cluster 2: it takes no more PUTs
    _wait_until_every_access_node_sees(cluster, lambda free: free["2"] == 0 < free["1"], "cluster 2 full")
    with Client(cluster.access_urls) as client:
        assert {client.stat(loc).cluster_id for loc in _put_many(client, 40)} == {1}
