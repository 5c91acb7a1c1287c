"""Faults on the data path, produced for real: dead blobnodes, flipped bytes on disk, lying or missing
request lengths (a clustermgr leader killed under a PUT stream: test_write_path_failover.py)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc.errors import NotFound
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.load import wait_for_put
from tests.support.metrics import sample
from tests.support.processes import LocalCluster

ClusterFactory = Callable[..., LocalCluster]


def put(client: httpx.Client, data: bytes) -> str:
    resp = client.put("/blob", content=data)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["location"])


def test_reads_survive_m_dead_blobnodes_and_fail_clearly_past_that(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory()
    rng = random.Random(3)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        objects = {put(client, data): data for data in (rng.randbytes(n) for n in (1, 5000, 3 << 20, 9 << 20))}
        for node in rng.sample(cluster.blobnodes, 3):  # EC3P3: M = 3
            node.kill9()
        for token, data in objects.items():
            assert client.get(f"/blob/{token}").content == data
            part = client.get(f"/blob/{token}", headers={"range": f"bytes=0-{len(data) // 2}"})
            assert part.content == data[: len(data) // 2 + 1]
        next(n for n in cluster.blobnodes if n.proc and n.proc.poll() is None).kill9()
        # The 9 MiB object needs all three data shards of each blob; only two nodes are left.
        failed = client.get(f"/blob/{max(objects, key=lambda t: len(objects[t]))}")
        assert failed.status_code == 503
        assert "cannot be read" in failed.json()["error"] and "blob" in failed.json()["error"]


def test_a_blobnode_lost_while_its_answer_is_relayed_never_yields_wrong_bytes(cluster_factory: ClusterFactory) -> None:
    """A GET whose bytes go from blobnodes' sockets to the client's (splice): a blobnode frozen, then another killed,
    while the client is mid-object ends that GET whole and right (its later runs read around the node: hedged,
    degraded) or cut short (the client sees a broken body, never a whole wrong one), within the shard timeout; the
    next GET reads around the lost node."""
    cluster = cluster_factory(shard_timeout=2.0, hedge_after=0.3)
    data = random.Random(17).randbytes(48 << 20)  # twelve blobs, six runs of two
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        token = put(client, data)
        for index, fault in ((1, "stop"), (2, "kill9")):
            path, _ = shard_file(cluster, token, index)
            lost = next(n for n in cluster.blobnodes if str(path).startswith(str(n.workdir)))
            got = bytearray()
            started = time.monotonic()
            try:
                try:
                    with client.stream("GET", f"/blob/{token}") as stream:
                        for chunk in stream.iter_bytes(1 << 20):
                            got += chunk
                            if len(got) == 4 << 20:  # the client is mid-object: its next runs are on their way
                                lost.kill9() if fault == "kill9" else os.kill(lost.pid, signal.SIGSTOP)
                                time.sleep(0.5)
                    assert bytes(got) == data
                except httpx.HTTPError:  # cut short: what came is the object's own bytes
                    assert len(got) < len(data) and bytes(got) == data[:len(got)]
                assert time.monotonic() - started < 30
                assert client.get(f"/blob/{token}").content == data
            finally:
                if fault == "stop":
                    os.kill(lost.pid, signal.SIGCONT)


def shard_file(cluster: LocalCluster, token: str, index: int) -> tuple[Path, int]:
    """The chunk file and shard offset holding shard `index` of the object's first blob."""
    location = Location.from_token(token, cluster.secret.encode())
    vid, bid = next(location.blob_ids())

    async def find() -> tuple[Path, int]:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
            unit = (await cm.get_volume(vid)).units[index]
            stat = await bn.chunk_stat(unit.host, unit.disk_id, unit.vuid)
            meta = await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)
            node = next(n for n in cluster.blobnodes if n.url == unit.host)
            disk = next(d["path"] for d in node.config["disks"]
                        if (Path(d["path"]) / "data" / stat.chunk_id).exists())
            return Path(disk) / "data" / stat.chunk_id, meta.offset

    return asyncio.run(find())


@pytest.mark.parametrize("size", [300_000, 9 << 20])  # one blob; three, the first two read as one run
def test_corrupted_data_shard_is_never_served(shared_cluster: LocalCluster, size: int) -> None:
    data = random.Random(5).randbytes(size)
    with httpx.Client(base_url=shared_cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        token = put(client, data)
        for index in (0, 1):  # two data shards of EC3P3's first blob, each flipped inside its first block
            path, offset = shard_file(shared_cluster, token, index)
            with open(path, "r+b") as f:
                f.seek(offset + 32 + 4 + 10)
                byte = f.read(1)
                f.seek(offset + 32 + 4 + 10)
                f.write(bytes([byte[0] ^ 0x5A]))
        assert client.get(f"/blob/{token}").content == data
        assert client.get(f"/blob/{token}", headers={"range": "bytes=5-20"}).content == data[5:21]


def raw_request(url: str, head: bytes, body: bytes, half_close: bool = False) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks):
                    break
        except OSError:
            pass
        return b"".join(chunks)


def test_lying_or_missing_lengths_write_nothing(shared_cluster: LocalCluster) -> None:
    access = shared_cluster.access[0]
    with httpx.Client(base_url=access.url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        chunked = client.put("/blob", content=iter([b"abc", b"def"]))
        assert chunked.status_code == 411 and "Content-Length" in chunked.json()["error"]
        huge = raw_request(access.url, b"PUT /blob HTTP/1.1\r\nHost: x\r\nContent-Length: 6442450944\r\n\r\n", b"")
        assert huge.startswith(b"HTTP/1.1 413")
        short = raw_request(access.url, b"PUT /blob HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
                            b"x" * 50_000, half_close=True)
        assert not short.startswith(b"HTTP/1.1 200")
        orphans = Path(access.config["orphan_log"])
        assert not orphans.exists() or orphans.read_text() == ""
        assert client.get("/health").status_code == 200


def test_a_moved_unit_is_refetched_not_served_stale(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(blobnodes=7)
    data = random.Random(9).randbytes(100_000)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        token = put(client, data)
        assert client.get(f"/blob/{token}").content == data  # the volume is now cached in access
        location = Location.from_token(token, cluster.secret.encode())
        vid, bid = next(location.blob_ids())

        async def move_unit_zero() -> None:
            async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
                volume = await cm.get_volume(vid)
                old = volume.units[0]
                await cm.lock_volume(vid)
                new = await cm.alloc_unit(vid, 0)
                await bn.create_chunk(new.host, new.disk_id, new.vuid)
                for shard in await bn.list_shards(old.host, old.disk_id, old.vuid):
                    payload = await bn.get_shard(old.host, old.disk_id, old.vuid, shard.bid)
                    await bn.put_shard(new.host, new.disk_id, new.vuid, shard.bid, payload)
                await cm.update_unit(vid, 0, new.vuid, new.disk_id)
                await cm.unlock_volume(vid)
                released = await cm.release_unit(vid, old.vuid, old.disk_id)  # its ticket, as a scheduler gets it
                await bn.release_chunk(old.host, old.disk_id, old.vuid, ticket=released.ticket)
                try:
                    await bn.get_shard(old.host, old.disk_id, old.vuid, bid)
                    raise AssertionError("the old chunk still serves")
                except NotFound:
                    pass

        asyncio.run(move_unit_zero())
        log_before = cluster.access[0].log_path.read_text()
        assert client.get(f"/blob/{token}").content == data
        assert "degraded read" not in cluster.access[0].log_path.read_text()[len(log_before):]


@pytest.mark.parametrize("size", [2 << 20, 9 << 20])  # one blob; three, read as runs of two and one
def test_a_hung_blobnode_is_hedged_around(cluster_factory: ClusterFactory, size: int) -> None:
    cluster = cluster_factory(hedge_after=0.3)
    data = random.Random(13).randbytes(size)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, data)
        path, _ = shard_file(cluster, token, 0)
        hung = next(n for n in cluster.blobnodes if str(path).startswith(str(n.workdir)))
        os.kill(hung.pid, signal.SIGSTOP)  # alive but answering nothing, like a stuck disk
        try:
            started = time.monotonic()
            assert client.get(f"/blob/{token}").content == data
            assert time.monotonic() - started < 3.0  # hedge (0.3 s) plus a degraded read, not the 10 s timeout
        finally:
            os.kill(hung.pid, signal.SIGCONT)


def test_a_small_object_outruns_a_hung_data_shard_within_the_tail_of_shard_reads(cluster_factory: ClusterFactory
                                                                                ) -> None:
    """Once access has seen enough shard reads to know their tail, a small GET whose data shard does not answer
    asks another shard for the same bytes after that tail (milliseconds), not after `hedge_after` (2 s here),
    decodes, and leaves the hung disk to be read last once `hedge_after` has passed."""
    cluster = cluster_factory(hedge_after=2.0)
    url = cluster.access[0].url
    objects = [random.Random(k).randbytes(64 << 10) for k in range(20)]
    with httpx.Client(base_url=url, timeout=60) as client:
        tokens = [wait_for_put(client, objects[0]), *(put(client, data) for data in objects[1:])]
        for _ in range(4):  # 80 reads: the tail is known after 64
            for token, data in zip(tokens, objects, strict=True):
                assert client.get(f"/blob/{token}").content == data
        path, _ = shard_file(cluster, tokens[0], 0)
        hung = next(n for n in cluster.blobnodes if str(path).startswith(str(n.workdir)))
        hedged_before = sample(url, "blobstore_access_tail_hedged_reads_total")
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert client.get(f"/blob/{tokens[0]}").content == objects[0]
            assert time.monotonic() - started < 0.5  # the tail (a few ms) and one more shard read, not 2 s
            assert sample(url, "blobstore_access_tail_hedged_reads_total") == hedged_before + 1
            time.sleep(2.0)  # the outrun read is dropped at hedge_after: its disk is read last from then on
            for token, data in zip(tokens, objects, strict=True):
                assert client.get(f"/blob/{token}").content == data
            assert sample(url, "blobstore_access_tail_hedged_reads_total") == hedged_before + 1
        finally:
            os.kill(hung.pid, signal.SIGCONT)


def test_a_put_without_quorum_fails_clearly_and_records_its_leftovers(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory()
    access = cluster.access[0]
    with httpx.Client(base_url=access.url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        for node in cluster.blobnodes[:2]:  # EC3P3 needs 5 of 6 shards
            node.kill9()
        resp = client.put("/blob", content=b"y" * 10_000)
        assert resp.status_code == 503
        assert "quorum is 5" in resp.json()["error"]
    leftovers = [json.loads(line) for line in Path(access.config["orphan_log"]).read_text().splitlines()]
    assert len(leftovers) == 1 and len(leftovers[0]["shards"]) == 4
