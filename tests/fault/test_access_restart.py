"""An access node killed -9 forgets nothing it owed: the repair messages it could not hand to mqproxy are sent
after its restart and the shards repaired, and access nodes restarted while no allocator runs write on the standby
grants they held, for what is left of their time, never on a bid taken before. Real processes; the kills are
kills -9 by PID, the mqproxy outage a SIGSTOP."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.load import wait_for_put
from tests.support.metrics import sample
from tests.support.processes import LocalCluster, Service, wait_until
from tests.support.shards import blobs_of, states

ClusterFactory = Callable[..., LocalCluster]
GRANT_BIDS = 10


def put(client: httpx.Client, data: bytes) -> str:
    resp = client.put("/blob", content=data)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["location"])


def process_state(service: Service) -> str:
    """R, S, T (stopped), ... as /proc tells it."""
    return Path(f"/proc/{service.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def kill9(service: Service) -> None:
    service.kill9()
    assert service.proc is not None and service.proc.returncode == -signal.SIGKILL


def test_repairs_queued_while_mqproxy_is_away_are_delivered_after_access_is_killed_9(
        cluster_factory: ClusterFactory) -> None:
    """A blobnode down: every PUT is acknowledged with five shards of six, its repair owed to mqproxy, which is
    paused. access is killed -9 holding those messages, restarted with the same config, and mqproxy resumed: the
    repairs arrive and every shard ends up on its unit."""
    cluster = cluster_factory(pipelines=True)
    access, mqproxy = cluster.access[0], cluster.background["mqproxy"]
    rng = random.Random(62)
    with httpx.Client(base_url=access.url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        down = cluster.blobnodes[0]
        kill9(down)
        os.kill(mqproxy.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: process_state(mqproxy) == "T", 10, "mqproxy stopped")
            objects = {put(client, data): data for data in (rng.randbytes(rng.randint(1, 300_000)) for _ in range(6))}
            blobs = [blob for token in objects for blob in blobs_of(cluster, token)]
            for vid, bid in blobs:  # every volume has a unit on each of the six blobnodes
                assert states(cluster, vid, bid).count("unreachable") == 1
            owed = sample(access.url, "blobstore_access_outbox_messages")
            assert owed >= len(blobs), owed
            kill9(access)
            down.start()
            access.start()
        finally:
            os.kill(mqproxy.pid, signal.SIGCONT)
        for vid, bid in blobs:
            wait_until(lambda v=vid, b=bid: states(cluster, v, b) == ["present"] * 6, 90,
                       f"every shard of blob {vid}/{bid} present")
        wait_until(lambda: sample(access.url, "blobstore_access_outbox_messages") == 0, 30, "the outbox empty")
        for token, data in objects.items():
            assert client.get(f"/blob/{token}").content == data


def held(access: Service, what: str) -> float:
    return sample(access.url, "blobstore_access_standby_held", {"code_mode": "EC3P3", "what": what})


def put_until_refused(client: httpx.Client, label: str) -> tuple[dict[str, bytes], httpx.Response]:
    stored: dict[str, bytes] = {}
    while True:
        data = f"{label}: {len(stored)}".encode()
        resp = client.put("/blob", content=data)
        if resp.status_code != 200:
            return stored, resp
        stored[resp.json()["location"]] = data


def test_access_nodes_restarted_while_no_allocator_runs_write_on_the_grants_they_held(
        cluster_factory: ClusterFactory) -> None:
    """Both allocators killed, then both access nodes killed -9 and restarted: each writes on the standby grants it
    held before (two of 10 bids), on none of the bids it wrote before the kill, with no more time left than they
    had; then answers 503."""
    cluster = cluster_factory(allocators=2, access=2, clustermgr={"volume_lease_ttl": 60}, reserve_bids=0,
                              standby_ride_out=20.0, standby_refill=0.5, standby_min_bids=GRANT_BIDS,
                              standby_max_bids=GRANT_BIDS, standby_min_bytes=1 << 20, standby_max_bytes=1 << 20)
    clients = [httpx.Client(base_url=node.url, timeout=30) for node in cluster.access]
    try:
        for client in clients:
            wait_for_put(client, b"warm-up")
        for node in cluster.access:
            wait_until(lambda n=node: held(n, "bids") == 2 * GRANT_BIDS, 20,
                       f"two standby grants on {node.url}")
        for allocator in cluster.allocators:
            kill9(allocator)
        before: dict[str, bytes] = {}
        for n, client in enumerate(clients):
            for i in range(3):
                data = f"access{n} before its restart: {i}".encode()
                before[put(client, data)] = data
        seconds = [(held(node, "seconds"), time.monotonic()) for node in cluster.access]
        for node in cluster.access:
            kill9(node)
        for node in cluster.access:
            node.start()
        after: dict[str, bytes] = {}
        for n, (node, client) in enumerate(zip(cluster.access, clients, strict=True)):
            data = f"access{n} after its restart".encode()
            after[put(client, data)] = data
            wait_until(lambda n=node: held(n, "bids") > 0, 10, f"{node.url} to show its stock")
            left, read_at = seconds[n]
            assert held(node, "seconds") <= left - (time.monotonic() - read_at) + 1.0  # counted on, not stretched
            stored, refused = put_until_refused(client, f"access{n} after its restart")
            assert 2 * GRANT_BIDS - 3 <= 1 + len(stored) <= 3 * GRANT_BIDS, len(stored)
            assert refused.status_code == 503 and "holds no space" in refused.json()["error"], refused.text
            after |= stored
        written = [blob for token in [*before, *after] for blob in blobs_of(cluster, token)]
        assert len(set(written)) == len(written)  # no bid written twice
        for token, data in {**before, **after}.items():
            assert clients[0].get(f"/blob/{token}").content == data
    finally:
        for client in clients:
            client.close()
