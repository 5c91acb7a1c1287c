"""Every allocator killed: access writes on the space it holds for that, then refuses clearly (503 with
Retry-After, also to a client still sending a large body), and writes through the allocators again once one is
back. One allocator killed while it leased every volume: the other leases the ones clustermgr keeps unleased, and
no PUT fails. Real processes; the outages are real kills -9."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

from tests.support.load import wait_for_put
from tests.support.processes import SIGNED, LocalCluster, Service, wait_until

ClusterFactory = Callable[..., LocalCluster]
GRANT_BIDS = 10


def standby_bids(client: httpx.Client) -> float:
    found = re.search(r'^blobstore_access_standby_held\{code_mode="EC3P3",what="bids"\} (\S+)$',
                      client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_puts_ride_out_on_held_space_then_get_a_clear_503(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(allocators=2, clustermgr={"volume_lease_ttl": 30}, reserve_bids=0,
                              standby_ride_out=5.0, standby_refill=0.5, standby_min_bids=GRANT_BIDS,
                              standby_max_bids=GRANT_BIDS, standby_min_bytes=1 << 20, standby_max_bytes=1 << 20)
    with httpx.Client(base_url=cluster.access[0].url, timeout=30) as client:
        wait_for_put(client, b"warm-up")
        wait_until(lambda: standby_bids(client) == 2 * GRANT_BIDS, 20, "two standby grants")
        for allocator in cluster.allocators:
            allocator.kill9()
        stored = {}
        while True:
            data = f"written while no allocator runs: {len(stored)}".encode()
            resp = client.put("/blob", content=data)
            if resp.status_code != 200:
                break
            stored[resp.json()["location"]] = data
        # Two grants of 10 bids (one may have been half used and replaced by a fresh one just before the kill).
        assert 2 * GRANT_BIDS <= len(stored) <= 3 * GRANT_BIDS, len(stored)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "5", resp.text
        assert "no allocator" in resp.json()["error"] and "holds no space" in resp.json()["error"]

        # A large body is answered the same way (uvicorn reads and drops the rest of it): no reset mid-body.
        big = client.put("/blob", content=bytes(8 << 20))
        assert big.status_code == 503 and big.headers["retry-after"] == "5"
        for token, data in stored.items():
            assert client.get(f"/blob/{token}").content == data

        cluster.allocators[0].start()
        wait_for_put(client, b"the allocators are back")


def leased_vids(allocator: Service) -> set[int]:
    return {v["vid"] for v in httpx.get(f"{allocator.url}/stat", auth=SIGNED).json()["volumes"]}


def test_an_allocator_whose_peer_leased_every_volume_leases_the_spare_ones(cluster_factory: ClusterFactory) -> None:
    """The first allocator to start leases what it wants (4) of the floor of 2 writable volumes: all of them, as
    leasing a dead peer's lapsed volumes does in a larger cluster. The other leases from the unleased volumes
    clustermgr keeps in stock, so when the first is killed (its leases outlive it by the lease ttl) no PUT fails.
    Access holds no space of its own here (no reserve, no standby): every PUT needs an allocator's answer."""
    cluster = cluster_factory(allocators=2, clustermgr={"volume_lease_ttl": 30}, reserve_bids=0, standby_ride_out=0)
    first, second = cluster.allocators
    wait_until(lambda: len(leased_vids(first)) == 4 and leased_vids(second), 20, "both allocators hold volumes")
    with httpx.Client(base_url=cluster.access[0].url, timeout=30) as client:
        wait_for_put(client, b"warm-up")
        first.kill9()
        stored = {}
        for n in range(40):
            data = f"written with one allocator: {n}".encode()
            resp = client.put("/blob", content=data)
            assert resp.status_code == 200, (n, resp.text)
            stored[resp.json()["location"]] = data
        for token, data in stored.items():
            assert client.get(f"/blob/{token}").content == data
