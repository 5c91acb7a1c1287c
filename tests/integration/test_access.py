"""The data path end to end: real access, allocator, clustermgr and blobnode processes."""

from __future__ import annotations

import hashlib
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import redis

from blobstore_server.libs import space
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.location import Location
from tests.support.load import wait_for_put
from tests.support.metrics import sample
from tests.support.processes import SIGNED, LocalCluster, RedisServer, stop_all

ClusterFactory = Callable[..., LocalCluster]


def test_round_trips_and_ranges(shared_cluster: LocalCluster) -> None:
    rng = random.Random(7)
    with httpx.Client(base_url=shared_cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        for size in (0, 1, 4096, (4 << 20) - 1, 4 << 20, (4 << 20) + 1, 20 << 20):
            data = rng.randbytes(size)
            resp = client.put("/blob", content=data)
            assert resp.status_code == 200, resp.text
            token = resp.json()["location"]
            got = client.get(f"/blob/{token}")
            assert got.status_code == 200 and got.content == data, size
            for _ in range(5 if size else 0):
                a = rng.randrange(size)
                b = rng.randrange(a, size)
                part = client.get(f"/blob/{token}", headers={"range": f"bytes={a}-{b}"})
                assert part.status_code == 206 and part.content == data[a:b + 1]
                assert part.headers["content-range"] == f"bytes {a}-{b}/{size}"
        head = client.head(f"/blob/{token}")
        assert head.headers["content-length"] == str(20 << 20)


def test_a_large_object_is_read_a_run_of_blobs_at_a_time_and_relayed_in_the_kernel(
        shared_cluster: LocalCluster) -> None:
    """Consecutive blobs of one volume come from each data shard's unit in one batched read per run of
    `read_ahead` (2) blobs: half the shard requests of reading blob by blob. Their bytes go from the blobnodes'
    sockets to the client's by splice, never through access; a client that leaves mid-object leaves no blobnode
    connection open behind it."""
    access = shared_cluster.access[0]
    data = random.Random(11).randbytes(16 << 20)  # four 4 MiB blobs, EC3P3: 3 data shards each

    def shard_reads() -> dict[str, float]:
        return {route: sum(sample(n.url, "blobstore_http_requests_total", {"route": route, "status": "200"})
                           for n in shared_cluster.blobnodes) for route in ("/shard/get", "/shard/get_batch")}

    def spliced() -> float:
        return sample(access.url, "blobstore_spliced_bytes_total")

    with httpx.Client(base_url=access.url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        token = client.put("/blob", content=data).json()["location"]
        vids = [vid for vid, _ in Location.from_token(token, shared_cluster.secret.encode()).blob_ids()]
        assert len(set(vids)) == 1, "one allocation, one volume"
        before, relayed = shard_reads(), spliced()
        assert client.get(f"/blob/{token}").content == data
        after = shard_reads()
        assert after["/shard/get_batch"] - before["/shard/get_batch"] == 2 * 3  # two runs, three units each
        assert after["/shard/get"] == before["/shard/get"]
        part = client.get(f"/blob/{token}", headers={"range": "bytes=3145733-15000000"})
        assert part.status_code == 206 and part.content == data[3145733:15000001]
        assert spliced() - relayed == len(data) + len(part.content)

        connections = _open_sockets(access.pid)
        for _ in range(5):
            with client.stream("GET", f"/blob/{token}") as stream:
                next(stream.iter_bytes(1 << 20))  # the first MiB, then the client hangs up
        assert client.get(f"/blob/{token}").content == data
        # At most the pool's few more, not 3 per dropped GET; a loaded box may take a while to close the dropped ones.
        deadline = time.monotonic() + 15
        while _open_sockets(access.pid) > connections + 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _open_sockets(access.pid) <= connections + 6


def _open_sockets(pid: int) -> int:
    return sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if fd.readlink().name.startswith("socket:"))


def test_bad_input_is_refused_with_a_reason(shared_cluster: LocalCluster) -> None:
    with httpx.Client(base_url=shared_cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, b"0123456789")
        forged = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
        assert client.get(f"/blob/{forged}").status_code == 403
        assert client.get("/blob/not*a*token").status_code == 400
        out_of_range = client.get(f"/blob/{token}", headers={"range": "bytes=10-20"})
        assert out_of_range.status_code == 416 and "range" in out_of_range.json()["error"].lower()
        unknown = client.put("/blob", content=b"x", headers={"x-code-mode": "EC99P1"})
        assert unknown.status_code == 400 and "code mode" in unknown.json()["error"]
        no_queue = client.delete(f"/blob/{token}")  # no mqproxy in this cluster: nothing can be queued
        assert no_queue.status_code == 503 and "mqproxy" in no_queue.json()["error"]
        assert client.get(f"/blob/{token}").content == b"0123456789"


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_100_mib_object_streams_through_with_bounded_memory(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory()
    access = cluster.access[0]
    size, piece = 100 << 20, 1 << 20

    def body() -> Iterator[bytes]:
        for i in range(size // piece):
            yield hashlib.sha256(i.to_bytes(4, "big")).digest() * (piece // 32)

    expected = hashlib.sha256(b"".join(body())).hexdigest()
    with httpx.Client(base_url=access.url, timeout=120) as client:
        wait_for_put(client, b"warm-up")
        baseline = peak_rss_mib(access.pid)
        resp = client.put("/blob", content=body(), headers={"content-length": str(size)})
        assert resp.status_code == 200, resp.text
        token = resp.json()["location"]
        digest = hashlib.sha256()
        with client.stream("GET", f"/blob/{token}") as stream:
            for chunk in stream.iter_bytes():
                digest.update(chunk)
        assert digest.hexdigest() == expected
    # One blob (4 MiB) and its shards in flight, never the object: far below its 100 MiB.
    assert peak_rss_mib(access.pid) - baseline < 60


def test_volume_info_is_shared_through_redis(cluster_factory: ClusterFactory, redis_url: str) -> None:
    """A new access node reads volumes through Redis when clustermgr cannot answer."""
    cluster = cluster_factory(redis_url=redis_url)
    data = random.Random(11).randbytes(50_000)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, data)
        assert client.get(f"/blob/{token}").content == data
    location = Location.from_token(token, cluster.secret.encode())
    vid = next(location.blob_ids())[0]
    assert redis.Redis.from_url(redis_url).exists(f"blobstore:{location.cluster_id}:volume:{vid}")
    stop_all(cluster.clustermgr)
    fresh = cluster.add_access()
    with httpx.Client(base_url=fresh.url, timeout=60) as client:
        assert client.get(f"/blob/{token}").content == data


def test_a_redis_that_resets_or_dies_under_access_costs_no_get(cluster_factory: ClusterFactory,
                                                               redis_server: RedisServer) -> None:
    """Redis is only a cache: its connections reset under access (the pooled sockets then close unseen), later
    killed -9, the next volume lookups fall through to clustermgr and every GET is served."""
    cluster = cluster_factory(redis_url=redis_server.url, volume_cache_ttl=0.3)
    data = random.Random(12).randbytes(50_000)
    port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, data)
        for break_redis in (lambda: subprocess.run(["ss", "-K", "state", "established", "sport", "=", f":{port}"],
                                                   check=True, capture_output=True),  # an RST to each client
                            redis_server.process.kill):
            assert client.get(f"/blob/{token}").content == data  # the volume is cached in Redis and locally
            break_redis()
            time.sleep(0.5)  # the local entry expires: the next GET asks Redis first
            for _ in range(3):
                answer = client.get(f"/blob/{token}")
                assert answer.status_code == 200, answer.text
                assert answer.content == data


def test_small_objects_share_a_reservation_and_its_unused_bytes_go_back(cluster_factory: ClusterFactory) -> None:
    """Small PUTs take consecutive bids of one allocation; the bytes and bids a reservation did not use are handed
    back to the allocator, so the volumes' accounting stays within one reservation of what was written (a page a
    unit per object, charged at most a tenth more: libs/space.py)."""
    cluster = cluster_factory(reserve_bids=16, reserve_bytes=64 << 10, reserve_ttl=0.5)
    data = [random.Random(i).randbytes(1000) for i in range(21)]
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        time.sleep(0.6)  # the warm-up's reservation lapses
        tokens = [client.put("/blob", content=d).json()["location"] for d in data[:20]]
        time.sleep(0.6)
        tokens.append(client.put("/blob", content=data[20]).json()["location"])  # returns the last one's rest
        for token, expected in zip(tokens, data, strict=True):
            assert client.get(f"/blob/{token}").content == expected
        used = sum(v["used"] for v in httpx.get(f"{cluster.allocators[0].url}/stat", auth=SIGNED).json()["volumes"])
    placed = [Location.from_token(t, LocalCluster.secret.encode()).blobs[0] for t in tokens[:16]]
    assert len({p.vid for p in placed}) == 1 and [p.min_bid for p in placed] == list(range(placed[0].min_bid,
                                                                                       placed[0].min_bid + 16))
    written = 22 * 4096  # the warm-up and the 21 objects take a page on each unit
    open_reservation = space.charge(CodeMode.EC3P3, 64 << 10, 4 << 20, 16)
    assert written <= used <= 1.1 * written + open_reservation, used  # at most the open one beyond what was written


def test_a_small_object_is_stored_when_no_volume_has_room_for_a_reservation(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(clustermgr={"chunk_size": 4 << 20}, reserve_bytes=256 << 20)  # 4 MiB chunks
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, b"small enough for any volume")
        assert client.get(f"/blob/{token}").content == b"small enough for any volume"
