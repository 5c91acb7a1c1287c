"""The SDK and the `blobstore` CLI against a real cluster started by the launcher, across hosts.

One cluster serves the whole module: as root (as CI runs) `cluster up --hosts 6 --racks 2`, six network
namespaces with six addresses, each host a blobnode with one disk, three Kafka brokers (replication 3), EC3P3,
two allocators and two access nodes, mqproxy, tinker and a worker; the SDK and the CLI reach it from the root
namespace. Without root the same cluster on 127.0.0.1 (and the host tests skip). It is stopped by PID at the
end whatever happens; the last tests check that `cluster down` leaves no process, namespace or bridge behind,
also after the launcher itself was killed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from typer.testing import CliRunner

import blobstore
from blobstore import AsyncClient, BadRequest, Client, Forbidden, NotFound, RangeNotSatisfiable, Unavailable
from blobstore_server.cli.cli import app
from blobstore_server.cluster import netns
from blobstore_server.cluster.launcher import ClusterInfo, LauncherError, ProcessRecord, restart
from blobstore_server.cluster.procs import free_ports, poll
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.tinker import PipelineStats
from blobstore_server.services.tinker.client import TinkerClient
from tests.support.damage import FLIPPED_AT, flip_a_byte
from tests.support.launched import SIX_HOSTS, SMALL
from tests.support.metrics import sample

LAUNCH = SMALL  # the launched `cluster` (tests/conftest.py)
STOPS_ITS_CLUSTER = True  # its last tests take the cluster down: the other modules on it run first

MiB = 1 << 20
SIZES = [0, 1, 5 * MiB + 1]
KINDS = ["bytes", "file", "iterator"]
on_hosts = pytest.mark.skipif(not SIX_HOSTS, reason="hosts as network namespaces need root")


@pytest.fixture(scope="module")
def client(cluster: ClusterInfo) -> Iterator[Client]:
    with Client(cluster.access_urls, ca=cluster.ca) as c:
        yield c


@contextmanager
def _source(kind: str, data: bytes, tmp_path: Path) -> Iterator[tuple[Any, int | None]]:
    """What put() is given for `kind`, and the size= it needs."""
    if kind == "bytes":
        yield data, None
    elif kind == "file":
        path = tmp_path / "upload.bin"
        path.write_bytes(data)
        with open(path, "rb") as f:
            yield f, None
    else:
        yield (data[i:i + 100_000] for i in range(0, len(data), 100_000)), len(data)


def test_public_api_is_exactly_all() -> None:
    public = {name for name in dir(blobstore)
              if not name.startswith("_") and not inspect.ismodule(getattr(blobstore, name))}
    assert public == set(blobstore.__all__)
    assert sorted(blobstore.__all__) == ["AsyncClient", "BadRequest", "BlobstoreError", "Client", "Conflict",
                                         "Forbidden", "NotFound", "Progress", "RangeNotSatisfiable", "Slice", "Stat",
                                         "Unavailable", "UndeleteResult", "Upload", "UploadIncomplete"]
    # The servers import the records and errors: the clients and their HTTP stack load on first use.
    loaded = subprocess.run([sys.executable, "-c", "import sys, blobstore.records; print(sorted(sys.modules))"],
                            capture_output=True, text=True, check=True).stdout
    assert "blobstore.client" not in loaded and "httpx" not in loaded


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_sync_round_trip(client: Client, tmp_path: Path, kind: str, size: int) -> None:
    data = os.urandom(size)
    with _source(kind, data, tmp_path) as (source, size_arg):
        location = client.put(source, size=size_arg)
    assert client.get(location) == data
    stat = client.stat(location)
    assert (stat.size, stat.code_mode) == (size, "EC3P3")


@pytest.mark.parametrize("size", SIZES)
def test_async_round_trip(cluster: ClusterInfo, tmp_path: Path, size: int) -> None:
    data = os.urandom(size)

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, size, 300_000):
            yield data[i:i + 300_000]

    async def run() -> None:
        async with AsyncClient(cluster.access_urls, ca=cluster.ca) as c:
            for kind in KINDS:
                with _source(kind, data, tmp_path) as (source, size_arg):
                    location = await c.put(source, size=size_arg)
                assert await c.get(location) == data, kind
            location = await c.put(pieces(), size=size)
            assert b"".join([p async for p in c.get_stream(location, chunk_size=64 << 10)]) == data
            received = [p async for p in c.get_stream(location, chunk_size=None)]
            assert b"".join(received) == data
            if size > 1 * MiB:  # as received, not re-cut into httpx-aiohttp's 16 KiB pieces (a copy of each byte)
                assert max(map(len, received)) > 16 << 10
            assert (await c.stat(location)).size == size

    asyncio.run(run())


def test_ranges(client: Client) -> None:
    data = os.urandom(5 * MiB + 1)
    location = client.put(data)
    assert client.get(location, 100, 1000) == data[100:1100]
    assert client.get(location, 4 * MiB - 5, 10) == data[4 * MiB - 5:4 * MiB + 5]  # across a blob boundary
    assert client.get(location, len(data) - 7) == data[-7:]
    assert client.get(location, 3, 0) == b""
    with pytest.raises(RangeNotSatisfiable):
        client.get(location, len(data) + 10, 5)


def _served(cluster: ClusterInfo) -> tuple[float, float]:
    """Read plans handed out and body bytes sent by every access node."""
    return (sum(sample(url, "blobstore_access_read_plans_total") for url in cluster.access_urls),
            sum(sample(url, "blobstore_access_bytes_out_total") for url in cluster.access_urls))


def test_a_large_get_reads_the_data_shards_itself_and_what_fails_through_access(cluster: ClusterInfo,
                                                                              client: Client) -> None:
    data = os.urandom(9 * MiB + 5)  # three blobs
    location = client.put(data)
    plans, sent = _served(cluster)
    assert client.get(location) == data
    assert client.get(location, 3 * MiB, 5 * MiB) == data[3 * MiB:8 * MiB]
    assert b"".join(client.get_stream(location, 1, chunk_size=MiB)) == data[1:]
    now_plans, now_sent = _served(cluster)
    assert now_plans == plans + 3
    assert now_sent - sent < MiB, "access sent the objects' bytes (27 MiB), not plans"  # and /metrics pages

    # A flipped byte in the first blob's first data shard: its blobnode refuses the bytes, the SDK reads the rest
    # through access, which rebuilds them from parity. Never the flipped byte.
    shards = json.loads(_cli(cluster, "blob", "shards", location, "--json").stdout)
    first = min(s["bid"] for s in shards)
    rotten = next(s for s in shards if s["bid"] == first and s["index"] == 0)
    flip_a_byte(Unit(vuid=rotten["vuid"], disk_id=rotten["disk_id"], host=rotten["host"]), first)
    refused = sample(rotten["host"], "blobstore_blobnode_crc_failures_total")
    assert client.get(location) == data
    assert client.get(location, FLIPPED_AT - 3, 5 * MiB) == data[FLIPPED_AT - 3:FLIPPED_AT - 3 + 5 * MiB]
    assert sample(rotten["host"], "blobstore_blobnode_crc_failures_total") > refused
    now_plans += 2

    # The blobnode of the first blob's second data shard stops answering: that piece times out, the rest of the
    # object comes through access (which reads around the silent shard), and the bytes are still right. Access then
    # reads that disk last for a while, so the next GET gets no plan: access reads around it from the start.
    host = next(s["host"] for s in shards if s["bid"] == first and s["index"] == 1)
    victim = next(p for p in ClusterInfo.load(Path(cluster.dir)).processes if p.url == host)
    took = []
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        # one access node: the one that learns the disk is silent
        with Client(cluster.access_url, ca=cluster.ca) as fresh:
            for _ in range(2):
                started = time.monotonic()
                assert fresh.get(location) == data
                took.append(time.monotonic() - started)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    assert max(took) < 10, f"GETs took {took} s with one blobnode silent"
    assert _served(cluster)[0] == now_plans + 1


def test_streams_to_file_with_progress(client: Client, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(5 * MiB + 1))
    sent: list[tuple[int, int]] = []
    with open(source, "rb") as f:
        location = client.put(f, progress=lambda done, total: sent.append((done, total)))
    assert sent[-1] == (source.stat().st_size,) * 2 and len(sent) > 1
    got: list[tuple[int, int]] = []
    target = tmp_path / "target.bin"
    assert client.get_to_file(location, target, progress=lambda done, total: got.append((done, total))) == 5 * MiB + 1
    assert target.read_bytes() == source.read_bytes()
    assert got[-1] == (5 * MiB + 1,) * 2 and len(got) > 1
    streamed = tmp_path / "streamed.bin"
    with open(streamed, "wb") as f:
        for piece in client.get_stream(location, chunk_size=256 << 10):
            assert len(piece) <= 256 << 10
            f.write(piece)
    assert streamed.read_bytes() == source.read_bytes()


def test_errors(client: Client) -> None:
    location = client.put(b"signed")
    middle = len(location) // 2
    forged = location[:middle] + ("A" if location[middle] != "A" else "B") + location[middle + 1:]
    with pytest.raises(Forbidden):
        client.get(forged)
    with pytest.raises(Forbidden):
        client.stat(forged)
    with pytest.raises(BadRequest):
        client.get("not/a token")
    with pytest.raises(ValueError, match="size"):
        client.put(iter([b"abc"]))  # an iterator needs size=


def _gone(client: Client, location: str) -> bool:
    try:
        client.get(location)
        return False
    except NotFound:
        return True
    except Unavailable:  # a read that began before the delete breaks off once a later blob is marked
        return False


def test_delete(client: Client) -> None:
    location = client.put(os.urandom(5 * MiB + 1))  # two blobs
    client.delete(location)
    assert poll(lambda: _gone(client, location), 10.0, interval=0.1), "still readable 10 s after the delete"
    client.delete(location)  # a second delete is harmless
    with pytest.raises(NotFound):
        client.get(location)


def test_dead_host_is_skipped(cluster: ClusterInfo) -> None:
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    with Client([dead, *cluster.access_urls], connect_timeout=1.0, ca=cluster.ca) as c:
        for _ in range(4):  # hosts are drawn at random: the dead one comes first in some of these
            assert c.get(c.put(b"still works")) == b"still works"
            assert c.get(c.put(iter([b"a one-shot ", b"iterator"]), size=19)) == b"a one-shot iterator"
    with Client([dead], connect_timeout=1.0) as c, pytest.raises(Unavailable, match="no access host"):
        c.put(b"nowhere")


def _cli(cluster: ClusterInfo, *args: str) -> Any:
    result = CliRunner().invoke(app, [*args, "--dir", cluster.dir])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("kind", KINDS)
def test_a_parallel_put_goes_up_in_parts_and_reads_back(client: Client, kind: str, tmp_path: Path) -> None:
    data = os.urandom(9 * MiB + 7)  # three 4 MiB parts
    with _source(kind, data, tmp_path) as (source, size):
        location = client.put(source, size=size, parallel=3)
    assert client.get(location) == data
    assert client.get(location, 4 * MiB - 5, 10) == data[4 * MiB - 5:4 * MiB + 5]  # across two parts
    assert client.stat(location).crc == 0  # parts are not seen in order: no whole-object CRC
    with pytest.raises(ValueError, match="the upload is of"):
        client.put(data[:-1], upload=client.alloc(len(data)))


def test_cli_objects(cluster: ClusterInfo, tmp_path: Path) -> None:
    source = tmp_path / "cli.bin"
    source.write_bytes(os.urandom(MiB + 3))
    location = _cli(cluster, "put", str(source)).stdout.strip()
    _cli(cluster, "get", location, "-o", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()
    in_parts = _cli(cluster, "put", str(source), "--parallel", "2").stdout.strip()
    assert _cli(cluster, "get", in_parts).stdout_bytes == source.read_bytes()
    assert _cli(cluster, "get", location, "--range", "10-19").stdout_bytes == source.read_bytes()[10:20]
    assert json.loads(_cli(cluster, "stat", location, "--json").stdout)["size"] == MiB + 3
    assert "cluster 1" in _cli(cluster, "stat", location).stdout
    shards = json.loads(_cli(cluster, "blob", "shards", location, "--json").stdout)
    assert [s["index"] for s in shards] == list(range(6))
    assert {s["state"] for s in shards} == {"present"}
    assert len({s["disk_id"] for s in shards}) == 6
    failed = CliRunner().invoke(app, ["stat", "garbage!", "--dir", cluster.dir])
    assert failed.exit_code == 1 and failed.stderr.startswith("error:")


def test_cli_cluster_metadata(cluster: ClusterInfo) -> None:
    disks = json.loads(_cli(cluster, "disk", "list", "--json").stdout)
    assert len(disks) == 6 and all(d["alive"] for d in disks)
    volumes = json.loads(_cli(cluster, "volume", "list", "--json").stdout)
    # every unit on its own host (`cluster up` creates no volume before every blobnode registered), writable
    assert volumes and all(len({u["host"] for u in v["units"]}) == 6 and v["writable"] for v in volumes)
    vid = volumes[0]["vid"]
    assert json.loads(_cli(cluster, "volume", "get", str(vid), "--json").stdout)["vid"] == vid
    assert json.loads(_cli(cluster, "config", "get", "code_mode_policy").stdout)[0]["code_mode"] == "EC3P3"
    state = json.loads(_cli(cluster, "cluster", "status", "--json").stdout)
    names = {"allocator": ["allocator-h1", "allocator-h2"], "access": ["access-h1", "access-h2"],
             "clustermgr": ["clustermgr-h1", "clustermgr-h2", "clustermgr-h3"]} if SIX_HOSTS else {
        "allocator": ["allocator1", "allocator2"], "access": ["access1", "access2"],
        "clustermgr": ["clustermgr1", "clustermgr2", "clustermgr3"]}
    assert state["leader"] in names["clustermgr"]
    assert all(p["healthy"] for p in state["processes"])
    assert state["access_urls"] == cluster.access_urls and state["access_url"] == cluster.access_urls[0]
    assert [p["name"] for p in state["processes"] if p["role"] in {"allocator", "access"}] == [
        *names["allocator"], *names["access"]]
    assert all(url in _cli(cluster, "cluster", "status").stdout for url in cluster.access_urls)


def test_each_access_node_serves_and_reads_the_others_objects(cluster: ClusterInfo) -> None:
    """Both access nodes share the Location secret: an object stored through one reads back through the other."""
    assert len(cluster.access_urls) == 2 and cluster.access_url == cluster.access_urls[0]
    first, second = (Client([url], ca=cluster.ca) for url in cluster.access_urls)
    with first, second:
        data = os.urandom(MiB + 1)
        assert second.get(first.put(data)) == data
        assert first.get(second.put(data)) == data


def test_the_s3_gateway_serves_boto3_for_a_user_the_cli_made(cluster: ClusterInfo) -> None:
    """`cluster up` runs an S3 gateway (one on the hosts layout: its namespace is one machine's SQLite file);
    `blobstore s3 user add` finds its namespace through --dir, and boto3 stores and lists an object with the keys."""
    gateways = [p for p in cluster.processes if p.role == "s3"]
    assert len(gateways) == (1 if SIX_HOSTS else len(cluster.access_urls))
    keys = json.loads(_cli(cluster, "s3", "user", "add", "ci", "--json").stdout)
    s3 = boto3.client("s3", endpoint_url=gateways[0].url, aws_access_key_id=keys["access_key"],
                      aws_secret_access_key=keys["secret_key"], region_name="us-east-1",
                      config=botocore.config.Config(s3={"addressing_style": "path"}), verify=cluster.ca)
    s3.create_bucket(Bucket="ci-bucket")
    data = os.urandom(MiB + 3)
    s3.put_object(Bucket="ci-bucket", Key="dir/object", Body=data)
    assert s3.get_object(Bucket="ci-bucket", Key="dir/object")["Body"].read() == data
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="ci-bucket", Prefix="dir/")["Contents"]] == ["dir/object"]
    assert "ci\t" in _cli(cluster, "s3", "user", "list").stdout


def test_cli_delete_and_queue_stats(cluster: ClusterInfo, client: Client) -> None:
    location = client.put(os.urandom(5 * MiB + 1))  # --wait checks every blob
    result = _cli(cluster, "del", location, "--wait", "10")
    assert "delete queued" in result.stdout and "not found" in result.stdout
    failed = CliRunner().invoke(app, ["get", location, "--dir", cluster.dir])
    assert failed.exit_code == 1 and "404" in failed.stderr and len(failed.stderr.strip().splitlines()) == 1

    seen: list[Any] = []

    def drained() -> bool:  # purged after the 1 s safe delay and its offset committed
        seen[:] = [json.loads(_cli(cluster, "queue", "stats", "--json").stdout)["delete"]]
        return seen[0]["done"] >= 1 and sum(seen[0]["lag"]["blob_delete"].values()) == 0

    assert poll(drained, 20.0, interval=0.25), f"the delete pipeline did not drain within 20 s: {seen}"
    stats = json.loads(_cli(cluster, "queue", "stats", "--json").stdout)
    assert stats["repair"]["group"] == "tinker-repair" and stats["delete"]["group"] == "tinker-delete"
    assert set(stats["repair"]["lag"]) == {"shard_repair", "shard_repair_failed"}
    assert set(stats["repair_prior"]["lag"]) == {"shard_repair_prior"}
    assert set(stats["delete"]["lag"]["blob_delete"]) == {"0", "1"}
    assert stats["delete"]["failed"] == 0
    assert "consumer lag" in _cli(cluster, "queue", "stats").stdout
    gone = CliRunner().invoke(app, ["blob", "undelete", location, "--dir", cluster.dir])  # past the delay
    assert gone.exit_code == 1 and "404 purged" in gone.stderr and "safe delay (1 s)" in gone.stderr, gone.output


def test_cli_undelete_takes_a_queued_delete_back(cluster: ClusterInfo, client: Client) -> None:
    tinker = next(p.url for p in ClusterInfo.load(Path(cluster.dir)).processes if p.role == "tinker")

    def deletes() -> PipelineStats:
        async def stats() -> PipelineStats:
            async with TinkerClient() as tinkers:
                return (await tinkers.stats(tinker)).pipelines["delete"]

        return asyncio.run(stats())

    data = os.urandom(100_000)
    location = client.put(data)
    taken_back = deletes().undeleted
    _cli(cluster, "task", "switch", "blob_delete", "off")  # tinker leaves the delete in Kafka
    try:
        assert poll(lambda: deletes().paused, 10.0, interval=0.25), "tinker did not pause its deletes"
        client.delete(location)
        assert "no delete had reached its shards yet" in _cli(cluster, "blob", "undelete", location).stdout
    finally:
        _cli(cluster, "task", "switch", "blob_delete", "on")
    assert poll(lambda: deletes().undeleted == taken_back + 1, 20.0, interval=0.25), "tinker did not take it back"
    assert client.get(location) == data


def _machines(cluster: ClusterInfo) -> dict[str, str]:
    """Each process's URL -> the host it runs on."""
    return {p.url: p.host for p in ClusterInfo.load(Path(cluster.dir)).processes}


def _record(cluster: ClusterInfo, name: str) -> ProcessRecord:
    return next(p for p in ClusterInfo.load(Path(cluster.dir)).processes if p.name == name)


@on_hosts
def test_every_process_runs_in_its_hosts_namespace_at_its_address(cluster: ClusterInfo) -> None:
    net = cluster.net()
    assert net is not None and len({h.address for h in net.hosts}) == 6
    info = ClusterInfo.load(Path(cluster.dir))
    records = info.processes
    for host in net.hosts:
        mine = info.on_host(host.name)
        assert {"blobnode", *(["kafka"] if host.name in ("h4", "h5", "h6") else [])} <= {p.role for p in mine}
        assert {p.pid for p in mine} <= set(netns.pids(host.namespace)), host.name  # inside its namespace
        assert all(p.url.split("://")[1].startswith(f"{host.address}:") for p in mine)
    assert {p.host for p in records} == {h.name for h in net.hosts}
    shown = json.loads(_cli(cluster, "cluster", "status", "--json").stdout)["processes"]
    assert all(p["host"] and p["healthy"] for p in shown)
    assert (Path(cluster.dir) / "h1" / "config" / "access.json").exists()  # run from its rendered bundle


@on_hosts
def test_every_shard_of_a_blob_sits_on_its_own_host(cluster: ClusterInfo, client: Client) -> None:
    location = client.put(os.urandom(5 * MiB + 1))  # two blobs
    shards = json.loads(_cli(cluster, "blob", "shards", location, "--json").stdout)
    machines = _machines(cluster)
    for bid in {s["bid"] for s in shards}:
        hosts = [machines[s["host"]] for s in shards if s["bid"] == bid]
        assert sorted(hosts) == [f"h{i}" for i in range(1, 7)], hosts


@on_hosts
def test_a_blobnode_killed_in_its_namespace_loses_no_write_and_restarts_there(cluster: ClusterInfo,
                                                                             client: Client) -> None:
    written: list[tuple[str, bytes]] = []
    failures: list[Exception] = []
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            data = os.urandom(64 * 1024)
            try:
                written.append((client.put(data), data))
            except Exception as exc:  # any failure fails the test below
                failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert poll(lambda: len(written) >= 10, 20.0)
        victim = _record(cluster, "blobnode-h2")
        os.kill(victim.pid, signal.SIGKILL)
        before = len(written)
        assert poll(lambda: len(written) >= before + 30, 30.0), "writes stalled with one blobnode gone"
        [back] = restart(Path(cluster.dir), "blobnode-h2")
        assert back.pid in netns.pids(back.namespace) and back.host == "h2"
        after = len(written)
        assert poll(lambda: len(written) >= after + 10, 20.0)
    finally:
        stop.set()
        thread.join()
    assert failures == []
    for location, data in written:
        assert client.get(location) == data


@on_hosts
def test_deletes_queued_while_a_kafka_host_is_cut_off_are_all_carried_out(cluster: ClusterInfo,
                                                                          client: Client) -> None:
    """h6 runs a Kafka broker (and a blobnode): pull its cable, delete objects, plug it back in. With replication
    3 and min.insync.replicas 2 every acknowledged delete is carried out; none is lost."""
    net = cluster.net()
    assert net is not None
    objects = [client.put(os.urandom(100_000)) for _ in range(20)]
    deleted: list[str] = []
    netns.set_link(net.host("h6"), up=False)
    try:
        for location in objects:  # a delete may wait out Kafka moving a partition off the lost broker
            assert poll(lambda loc=location: _delete_acknowledged(client, loc), 60.0, interval=0.5)  # type: ignore[misc]
            deleted.append(location)
    finally:
        netns.set_link(net.host("h6"), up=True)
    assert deleted == objects
    assert poll(lambda: all(_gone(client, loc) for loc in deleted), 90.0, interval=1.0), "a delete was lost"

    def drained() -> bool:
        lag = json.loads(_cli(cluster, "queue", "stats", "--json").stdout)["delete"]["lag"]["blob_delete"]
        return sum(lag.values()) == 0

    assert poll(drained, 90.0, interval=1.0), "the delete queue did not drain after the broker's host came back"


def _delete_acknowledged(client: Client, location: str) -> bool:
    try:
        client.delete(location)
        return True
    except Unavailable:
        return False


def test_cluster_down_leaves_nothing(cluster: ClusterInfo) -> None:
    """Runs after every test on the shared cluster: it stops it."""
    records = ClusterInfo.load(Path(cluster.dir)).processes
    assert sorted(p.role for p in records) == sorted(["redis", *["kafka"] * (3 if SIX_HOSTS else 1),
                                                      *["clustermgr"] * 3, *["blobnode"] * 6,
                                                      *["allocator"] * 2, *["scheduler"] * 2, "worker", "mqproxy",
                                                      "tinker", *["access"] * 2, "dashboard",
                                                      *["s3"] * (1 if SIX_HOSTS else 2)])
    _cli(cluster, "cluster", "down")
    assert [p.name for p in records if p.running] == []
    assert _processes_mentioning(cluster.dir) == []  # every command line names a config under the cluster dir
    if SIX_HOSTS:
        assert cluster.network and not [n for n in netns.namespaces() if n.startswith(f"{cluster.network}-")]
        assert cluster.network not in {f"bs{k}" for k in netns.in_use()}  # no bridge, no link left


@on_hosts
def test_cluster_down_cleans_up_after_a_killed_launcher(tmp_path: Path) -> None:
    launcher = subprocess.Popen([str(Path(sys.executable).parent / "blobstore"), "cluster", "up", "--hosts", "6",
                                 "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def midway() -> bool:  # Redis started, Kafka's JVMs being launched (not yet recorded)
            try:
                return bool(ClusterInfo.load(tmp_path).processes)
            except (LauncherError, OSError, ValueError):  # not written yet, or half written
                return False

        assert poll(midway, 60.0, interval=0.1), "the launcher never got to start a process"
        info = ClusterInfo.load(tmp_path)
        assert info.network and [n for n in netns.namespaces() if n.startswith(f"{info.network}-")]
    finally:
        launcher.kill()
        launcher.wait()
        result = CliRunner().invoke(app, ["cluster", "down", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert _processes_mentioning(str(tmp_path)) == []
    assert info.network not in {f"bs{k}" for k in netns.in_use()}


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found
