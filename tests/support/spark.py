"""The `blobstore` CLI run in the test process, and what an inspection wrote (its summary and findings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from typer.testing import CliRunner, Result

from blobstore_server.cli.cli import app
from blobstore_server.libs.proto import export
from blobstore_server.libs.proto.blobnode import S3Access
from tests.support.processes import LocalCluster


def blobstore(*args: str) -> Result:
    """The `blobstore` CLI in this process (a running SparkSession is reused by the jobs)."""
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def cluster_args(cluster: LocalCluster) -> list[str]:
    return ["--clustermgr", ",".join(cm.url for cm in cluster.clustermgr)]


def summary(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return loaded


def found(out: Path, finding: str) -> set[tuple[int, int, int]]:
    """(vid, bid, unit index) of every finding of a type (None where the type has no such field)."""
    folder = out / "findings" / f"finding={finding}"
    if not folder.exists():
        return set()
    return {(r["vid"], r["bid"], r["unit_index"]) for r in pq.read_table(folder).to_pylist()}


def s3a_options(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """Hadoop options for Spark to read and write s3a://bucket/key on an S3 gateway at `endpoint` as one user; a read
    or write takes them as `.options(**...)`. 5 MiB blocks (S3's smallest part) make a file of a few MiB a
    multipart upload, as gigabytes would be; no retries, so a test sees the first answer."""
    user = S3Access(endpoint=endpoint, access_key=access_key, secret_key=secret_key)
    return {**export.s3a_options(user), "fs.s3a.multipart.size": "5M", "fs.s3a.attempts.maximum": "1",
            "fs.s3a.retry.limit": "1"}
