"""The S3 gateway against the project's own SDK, on one local cluster (the launcher's default shape, its
gateways beside the access nodes).

- 10 KiB PUT and GET: boto3 through the gateway (8 threads, one client each) against the SDK straight to access
  (8 concurrent requests), alternated in rounds (A B A B A B); the ratio is boto3's rate over the SDK's. CPU per
  request from /proc over each side's rounds: the gateway's, the data path's (gateways, access nodes and
  blobnodes, less what they spend idle: heartbeats, scrubbing) and the client's (boto3 in this process, or the
  SDK): on this 2-core box the client shares the cores, so the rate ratio is bounded by (SDK path's CPU) / (S3
  path's CPU), boto3's own included.
- A large object (1 GiB; --big-mib): `aws s3 cp` up and down (the aws CLI from PyPI, `make setup` puts it in
  .venv/awscli: 8 MiB parts, 10 at once) between a file and the gateway, against the SDK's put (4 parts at once)
  and get of the same bytes from memory.
- ListObjectsV2 pages of 1000 keys out of a bucket of --keys keys (1,000,000), with and without a delimiter: the
  gateway's answer read whole (a presigned GET), and the same page through boto3, which parses it; on the cluster's
  SQLite namespace, then on PostgreSQL (a server of its own, tests/support/postgres.py, and a second gateway on it).
  The keys are inserted straight into the namespace (their listing is what is measured).
`--parts` picks what runs (small,big,list). Writes JSON and prints one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_seconds, drive
from blobstore import AsyncClient
from blobstore_server.cluster import launcher
from blobstore_server.cluster.launcher import ClusterInfo, ProcessRecord
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.services.s3.namespace import Extent, NamespaceStore, ObjectMeta, open_namespace
from blobstore_server.services.s3.namespace.base import encode_manifest, encode_meta
from blobstore_server.services.s3.namespace.dialect import POSTGRES_SCHEMES
from tests.support.postgres import running_postgres
from tests.support.processes import Service, free_port

ROUNDS = 3
THREADS = 8
SMALL = 10 << 10
MiB = 1 << 20
AWS_CLI = Path(__file__).resolve().parents[1] / ".venv" / "awscli" / "bin" / "aws"


def _client(url: str, keys: tuple[str, str]) -> Any:
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=keys[0], aws_secret_access_key=keys[1],
                        region_name="us-east-1",
                        config=botocore.config.Config(s3={"addressing_style": "path"}, max_pool_connections=THREADS,
                                                      retries={"max_attempts": 1}, signature_version="s3v4"))


def _threads(count: int, op: Callable[[int], object]) -> float:
    """ops per second of `op(0..count-1)` over THREADS threads."""
    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(op, range(count)))
    return count / (time.perf_counter() - start)


DATA_PATH = ("s3", "access", "blobnode")


class _CPU:
    """CPU seconds spent by the gateway, by the data path's processes (less their idle rate) and by this process
    (the client) over what it measures."""

    def __init__(self, info: ClusterInfo, gateway: Any, idle_per_second: float) -> None:
        self.pids, self.gateway = [p.pid for p in info.processes if p.role in DATA_PATH], gateway.pid
        self.idle_per_second = idle_per_second
        self.spent = {"gateway": 0.0, "cluster": 0.0, "client": 0.0}

    def __enter__(self) -> None:
        self._start, self._started = self._now(), time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        for name, (before, after) in zip(self.spent, zip(self._start, self._now(), strict=True), strict=True):
            self.spent[name] += after - before
        self.spent["cluster"] -= self.idle_per_second * (time.perf_counter() - self._started)

    def _now(self) -> tuple[float, float, float]:
        return cpu_seconds(self.gateway), sum(map(cpu_seconds, self.pids)), time.process_time()

    def per_request_ms(self, done: int) -> dict[str, float]:
        return {name: round(seconds / done * 1e3, 3) for name, seconds in self.spent.items()}


def small_objects(info: ClusterInfo, gateway: Any, s3: Any, count: int) -> dict[str, Any]:
    data = os.urandom(SMALL)
    keys = [f"small/{i:06d}" for i in range(count)]
    locations: list[str] = []
    out: dict[str, Any] = {}
    idle = _CPU(info, gateway, 0.0)
    with idle:
        time.sleep(5)
    idle_per_second = idle.spent["cluster"] / 5
    for name in ("put", "get"):
        ratios, done = [], 0
        by_s3, by_sdk = _CPU(info, gateway, idle_per_second), _CPU(info, gateway, idle_per_second)
        for r in range(ROUNDS):
            part = range(r * count // ROUNDS, (r + 1) * count // ROUNDS)
            def one(i: int, p: range = part, op: str = name) -> object:
                if op == "put":
                    return s3.put_object(Bucket="bench", Key=keys[p[i]], Body=data)
                return s3.get_object(Bucket="bench", Key=keys[p[i]])["Body"].read()

            with by_s3:
                s3_rate = _threads(len(part), one)
            with by_sdk:
                sdk_rate = asyncio.run(_sdk_rate(_access_hosts(info), name, data, len(part), locations))
            done += len(part)
            ratios.append(s3_rate / sdk_rate)
        s3_cpu, sdk_cpu = by_s3.per_request_ms(done), by_sdk.per_request_ms(done)
        out[name] = {"ratio": round(statistics.median(ratios), 3),
                     "gateway_cpu_ms_per_request": s3_cpu["gateway"],
                     "s3_path_cpu_ms_per_request": {"cluster": s3_cpu["cluster"], "client": s3_cpu["client"]},
                     "sdk_path_cpu_ms_per_request": {"cluster": sdk_cpu["cluster"], "client": sdk_cpu["client"]},
                     "cpu_bound_ratio": round((sdk_cpu["cluster"] + sdk_cpu["client"])
                                              / (s3_cpu["cluster"] + s3_cpu["client"]), 3)}
    return out


def _access_hosts(info: ClusterInfo) -> list[str]:
    """Every access node, as the gateway is given them: spread over two, a PUT costs the access nodes and the
    blobnodes more CPU than through one (each batches less), so the SDK is measured on the same spread."""
    return [p.url for p in info.processes if p.role == "access"]


async def _sdk_rate(hosts: list[str], name: str, data: bytes, count: int, locations: list[str]) -> float:
    async with AsyncClient(hosts, timeout=600, direct_reads=False) as sdk:
        async def put(i: int) -> None:
            locations.append(await sdk.put(data))

        async def get(i: int) -> None:
            assert len(await sdk.get(locations[i % len(locations)])) == len(data)

        latencies, elapsed = await drive(count, THREADS, put if name == "put" else get)
    return len(latencies) / elapsed


def _aws_cli(url: str, keys: tuple[str, str], home: Path) -> Callable[..., None]:
    """`aws s3 ...` against the gateway, with nothing of this machine's AWS settings."""
    home.mkdir(exist_ok=True)
    (home / "config").write_text("[default]\ns3 =\n    addressing_style = path\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "AWS_CONFIG_FILE": str(home / "config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"), "AWS_ACCESS_KEY_ID": keys[0],
           "AWS_SECRET_ACCESS_KEY": keys[1], "AWS_DEFAULT_REGION": "us-east-1"}

    def aws(*args: str) -> None:
        subprocess.run([str(AWS_CLI), "--endpoint-url", url, "s3", *args, "--no-progress"], env=env, check=True,
                       stdout=subprocess.DEVNULL, timeout=3600)

    return aws


def big_object(info: ClusterInfo, aws: Callable[..., None], size: int, workdir: Path) -> dict[str, Any]:
    data = os.urandom(size)
    source, sink = workdir / "big.in", workdir / "big.out"
    source.write_bytes(data)
    start = time.perf_counter()
    aws("cp", str(source), "s3://bench/big")
    up = size / (time.perf_counter() - start)
    start = time.perf_counter()
    aws("cp", "s3://bench/big", str(sink))
    down = size / (time.perf_counter() - start)
    assert sink.read_bytes() == data
    sink.unlink()

    async def sdk() -> tuple[float, float]:
        async with AsyncClient(_access_hosts(info), timeout=600, direct_reads=False) as client:
            start = time.perf_counter()
            location = await client.put(data, parallel=4)
            put = size / (time.perf_counter() - start)
            start = time.perf_counter()
            assert len(await client.get(location)) == size
            return put, size / (time.perf_counter() - start)

    sdk_up, sdk_down = asyncio.run(sdk())
    return {"size_mib": size // MiB, "upload_mb_s": round(up / 1e6, 1), "sdk_put_mb_s": round(sdk_up / 1e6, 1),
            "upload_ratio": round(up / sdk_up, 3), "download_mb_s": round(down / 1e6, 1),
            "sdk_get_mb_s": round(sdk_down / 1e6, 1), "download_ratio": round(down / sdk_down, 3)}


Row = tuple[str, bytes, int, str, int, str, str, None, str]
_COLUMNS = "bucket_id, key, size, etag, mtime_ms, meta, checksums, parts_count, manifest"


def _load(store: NamespaceStore, spec: str, rows: Iterable[Row]) -> None:
    """Rows straight into the objects table (PostgreSQL's COPY: a million INSERTs would take minutes), then the
    statistics a live table has."""
    if spec.startswith(POSTGRES_SCHEMES):
        with psycopg.connect(spec) as db, db.cursor().copy(f"COPY objects ({_COLUMNS}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    else:
        with store.transaction(write=True) as tx:
            tx.many(f"INSERT INTO objects ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    with store.transaction(write=True) as tx:
        tx.run("ANALYZE objects")


def listing(namespace: str, url: str, count: int) -> dict[str, Any]:
    """Pages of 1000 keys out of `count` keys in `dir%04d/obj%06d` form (1000 objects a folder), through the gateway
    at `url` on `namespace`."""
    store = open_namespace(namespace)
    try:
        keys = store.add_user("lister")
        bucket_id = store.create_bucket("listed", "lister").id
        meta, manifest = encode_meta(ObjectMeta()), encode_manifest([Extent(0, 1, "unused")])
        start = time.perf_counter()
        _load(store, namespace, ((bucket_id, b"dir%04d/obj%06d" % (i // 1000, i), 1, "e" * 32, 0, meta, "{}", None,
                                  manifest) for i in range(count)))
        loaded = time.perf_counter() - start
    finally:
        store.close()
    s3 = _client(url, keys)
    cases = {"no delimiter": {"StartAfter": f"dir{count // 2000:04d}/obj{count // 2:06d}"},
             "delimiter": {"Delimiter": "/"},
             "delimiter in a folder": {"Prefix": f"dir{count // 2000:04d}/", "Delimiter": "/"}}
    out: dict[str, Any] = {"load_s": round(loaded, 1)}
    with httpx.Client(timeout=60) as http:
        for name, params in cases.items():
            # the gateway's answer alone (a presigned GET read whole), then as boto3 users see it (parsed)
            url = s3.generate_presigned_url("list_objects_v2", Params={"Bucket": "listed", "MaxKeys": 1000,
                                                                       **params}, ExpiresIn=600)
            served, parsed = [], []
            for _ in range(7):
                start = time.perf_counter()
                assert http.get(url).status_code == 200
                served.append(time.perf_counter() - start)
                start = time.perf_counter()
                page = s3.list_objects_v2(Bucket="listed", MaxKeys=1000, **params)
                parsed.append(time.perf_counter() - start)
            assert page["KeyCount"] == (1000 if name != "delimiter" else min(1000, count // 1000)), name
            out[name] = {"median_ms": round(statistics.median(served) * 1e3, 1),
                         "boto3_median_ms": round(statistics.median(parsed) * 1e3, 1)}
    return out


@contextmanager
def _gateway_on(launched: ProcessRecord, namespace: str, workdir: Path) -> Iterator[str]:
    """A second gateway like `launched` (its keys, its access nodes) on `namespace`, stopped by its PID; its URL."""
    port = free_port()
    config = {**json.loads(Path(launched.config).read_text()), "bind_addr": f"127.0.0.1:{port}", "host": "",
              "namespace": namespace}
    workdir.mkdir(parents=True, exist_ok=True)
    service = Service("s3", config, workdir, f"http://127.0.0.1:{port}").start(60)
    try:
        yield service.url
    finally:
        service.stop()


def listings(gateway: ProcessRecord, count: int, root: Path) -> dict[str, Any]:
    """The listing on the cluster's SQLite namespace, then on PostgreSQL through a gateway of its own."""
    out = {"sqlite": listing(json.loads(Path(gateway.config).read_text())["namespace"], gateway.url, count)}
    with running_postgres() as server, _gateway_on(gateway, server.dsn(), root / "s3-postgres") as url:
        out["postgresql"] = listing(server.dsn(), url, count)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=1500, help="10 KiB objects per side")
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--parts", default="small,big,list", help="what to run: some of small,big,list")
    parser.add_argument("--out", default="bench/results/s3.json")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(chunk_size=8 << 30))
        try:
            gateway = next(p for p in info.processes if p.role == "s3")
            if parts & {"small", "big"}:
                store = open_namespace(json.loads(Path(gateway.config).read_text())["namespace"])
                keys = store.add_user("bench")
                store.close()
                s3 = _client(gateway.url, keys)
                s3.create_bucket(Bucket="bench")
            if "small" in parts:
                results["small"] = small_objects(info, gateway, s3, args.small)
            if "big" in parts:
                results["big"] = big_object(info, _aws_cli(gateway.url, keys, Path(tmp) / "aws"), args.big_mib * MiB,
                                            Path(tmp))
            if "list" in parts:
                results["list"] = listings(gateway, args.keys, Path(tmp))
        finally:
            launcher.down(root)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print("; ".join(_summary(results, args.keys)))


def _summary(results: dict[str, Any], keys: int) -> list[str]:
    lines = []
    if "small" in results:
        small = results["small"]
        lines.append(f"S3 gateway vs SDK: 10 KiB PUT {small['put']['ratio']}x, GET {small['get']['ratio']}x (gateway "
                     f"CPU {small['put']['gateway_cpu_ms_per_request']}/{small['get']['gateway_cpu_ms_per_request']} "
                     f"ms a request; CPU-bound ratios {small['put']['cpu_bound_ratio']}/"
                     f"{small['get']['cpu_bound_ratio']})")
    if "big" in results:
        big = results["big"]
        lines.append(f"{big['size_mib']} MiB up {big['upload_ratio']}x, down {big['download_ratio']}x")
    for engine, listed in results.get("list", {}).items():
        lines.append(f"ListObjectsV2 page of 1000 of {keys} keys on {engine} (served; parsed by boto3): "
                     + ", ".join(f"{k} {v['median_ms']}; {v['boto3_median_ms']} ms" for k, v in listed.items()
                                 if k != "load_s"))
    return lines


if __name__ == "__main__":
    main()
