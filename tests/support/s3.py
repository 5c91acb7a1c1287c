"""An S3 gateway in front of a test's cluster, on either namespace engine, and users made as an operator makes
them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from typer.testing import CliRunner

from blobstore_server.cli.cli import app
from tests.support.processes import LocalCluster, Service, free_port


@dataclass
class Gateway:
    service: Service
    namespace: str  # what the gateway's `namespace` config and the CLI's --namespace take
    cluster: LocalCluster

    @property
    def url(self) -> str:
        return self.service.url

    def client(self, access_key: str, secret: str, endpoint: str | None = None, addressing: str = "path",
               **config: Any) -> Any:
        """boto3 on the gateway (or `endpoint`), path-style unless told, no retries (a test sees the first answer)."""
        return boto3.client("s3", endpoint_url=endpoint or self.url, aws_access_key_id=access_key,
                            aws_secret_access_key=secret, region_name="us-east-1",
                            config=botocore.config.Config(s3={"addressing_style": addressing},
                                                          retries={"max_attempts": 1}, **config))

    def user(self, name: str) -> tuple[str, str]:
        """A user made as an operator makes one: `blobstore s3 user add NAME --json`."""
        result = CliRunner().invoke(app, ["s3", "user", "add", name, "--namespace", self.namespace, "--json"])
        assert result.exit_code == 0, result.output
        keys = json.loads(result.output)
        return keys["access_key"], keys["secret_key"]


def gateway_service(cluster: LocalCluster, workdir: Path, namespace: str, port: int | None = None,
                    **config: Any) -> Service:
    """A gateway's Service (not started) on `cluster`'s first access node: 1 MiB segments, garbage reaped fast."""
    port = port or free_port()
    settings = {"bind_addr": f"127.0.0.1:{port}", "access_hosts": [cluster.access[0].url], "namespace": namespace,
                "segment_size": 1 << 20, "gc_delay": 0.5, "reap_interval": 0.5, **config}
    return Service("s3", settings, workdir, f"http://127.0.0.1:{port}")


NAMESPACE_ENGINES = ["sqlite", "postgresql"]  # a fixture's params: its tests run on each


def new_namespace(engine: str, request: pytest.FixtureRequest) -> str | None:
    """A namespace of its own on `engine` for `running_gateway`: None (a SQLite file in the gateway's workdir), or
    a DSN of a fresh schema on the session's PostgreSQL server (started on first use)."""
    return None if engine == "sqlite" else request.getfixturevalue("postgres_server").new_schema()


@contextmanager
def running_gateway(cluster: LocalCluster, workdir: Path, namespace: str | None = None,
                    **config: Any) -> Iterator[Gateway]:
    """A started gateway, stopped (by its PID) on the way out; its namespace a SQLite file in `workdir` unless
    given (a file or a postgresql:// DSN)."""
    namespace = namespace or str(workdir / "namespace.db")
    service = gateway_service(cluster, workdir, namespace, **config)
    service.start()
    try:
        yield Gateway(service, namespace, cluster)
    finally:
        service.stop()
