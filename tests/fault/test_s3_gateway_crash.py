"""kill -9 of the S3 gateway in the middle of a PUT: the object never becomes visible, and every Location the PUT
had stored is found again through its intent and deleted through access once the intent is stale."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from typer.testing import CliRunner

from blobstore_server.cli.cli import app
from tests.support.load import wait_deleted
from tests.support.processes import LocalCluster, Service, free_port
from tests.support.s3 import gateway_service

MiB = 1 << 20
SIZE = 64 * MiB


def _gateway(cluster: LocalCluster, workdir: Path, port: int) -> Service:
    return gateway_service(cluster, workdir, str(workdir / "namespace.db"), port, gc_delay=0.0, intent_ttl=3.0)


def _signed(method: str, url: str, keys: dict[str, str], **headers: str) -> dict[str, str]:
    """The headers of a request with an unsigned payload (a body streams after signing)."""
    request = AWSRequest(method, url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD", **headers})
    S3SigV4Auth(Credentials(keys["access_key"], keys["secret_key"]), "s3", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def _intent_locations(namespace: Path) -> list[str]:
    with sqlite3.connect(namespace) as db:
        return [row[0] for row in db.execute("SELECT location FROM intent_extents")]


def test_a_gateway_killed_mid_put_shows_nothing_and_leaks_no_blob(
        cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cluster = cluster_factory(pipelines=True, clustermgrs=1, safe_delay=1.0)  # access deletes through Kafka
    port, namespace = free_port(), tmp_path / "namespace.db"
    gateway = _gateway(cluster, tmp_path, port).start()
    try:
        keys = json.loads(CliRunner().invoke(app, ["s3", "user", "add", "u", "--namespace", str(namespace),
                                                   "--json"]).output)
        created = httpx.put(f"{gateway.url}/crash", headers=_signed("PUT", f"{gateway.url}/crash", keys))
        assert created.status_code == 200, created.text
        sent = [0]

        def body() -> Iterator[bytes]:
            for _ in range(SIZE // MiB):
                sent[0] += MiB
                yield os.urandom(MiB)
                time.sleep(0.05)

        killed = False
        with httpx.Client(timeout=60) as client:
            try:
                with client.stream("PUT", f"{gateway.url}/crash/big",
                                   headers=_signed("PUT", f"{gateway.url}/crash/big", keys,
                                                   **{"content-length": str(SIZE)}),
                                   content=_killing(body(), lambda: len(_intent_locations(namespace)) >= 8,
                                                    gateway)) as response:
                    response.read()
            except httpx.HTTPError:
                killed = True
        assert killed and gateway.proc is not None and gateway.proc.poll() == -9, "the gateway was not killed"
        assert sent[0] < SIZE
        stored = _intent_locations(namespace)
        assert len(stored) >= 8
        gateway = _gateway(cluster, tmp_path, port).start()
        head = httpx.head(f"{gateway.url}/crash/big", headers=_signed("HEAD", f"{gateway.url}/crash/big", keys))
        assert head.status_code == 404  # never half-visible

        wait_deleted(cluster.access[0].url, stored, 60, "the killed PUT's Locations deleted")
        assert _intent_locations(namespace) == []
    finally:
        gateway.stop()


def _killing(pieces: Iterator[bytes], ready: Callable[[], bool], gateway: Service) -> Iterator[bytes]:
    """`pieces`, until `ready()`: then the gateway is killed -9 and the body goes on (into a dead socket)."""
    for piece in pieces:
        if ready() and gateway.proc is not None and gateway.proc.poll() is None:
            gateway.kill9()
        yield piece
