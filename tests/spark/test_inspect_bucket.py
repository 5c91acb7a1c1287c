"""`inspect run` with its defaults on a cluster of several hosts: every blobnode writes its disks' export into the
cluster's inspection bucket on the S3 gateway, Spark reads them and writes the findings there through s3a, and the
operator reads the summary with any S3 client. (A folder would be one machine's: the blobnodes of other hosts could
not write to it, nor a Spark driver elsewhere read it.)"""

from __future__ import annotations

import json
import random
from pathlib import Path

import boto3
from botocore.config import Config
from pyspark.sql import SparkSession

from blobstore import Client
from blobstore_server.cluster.launcher import ClusterInfo, cluster_secret
from blobstore_server.cluster.plan import EXPORT_BUCKET, export_access
from tests.support.launched import SMALL
from tests.support.spark import blobstore

LAUNCH = SMALL  # the launched `cluster` (tests/conftest.py): six hosts when run as root


def test_inspect_run_with_its_defaults_puts_exports_and_findings_in_the_clusters_bucket(
        cluster: ClusterInfo, spark: SparkSession) -> None:
    with Client(cluster.access_urls, ca=cluster.ca) as client:
        stored = [client.put(random.Random(i).randbytes(20_000)) for i in range(12)]

    result = blobstore("inspect", "run", "--dir", cluster.dir, "--settle", "0")

    assert result.exit_code == 0, result.output
    assert f"s3://{EXPORT_BUCKET}/inspect" in result.output
    gateway = next(p.url for p in cluster.processes if p.role == "s3")
    secret = cluster_secret(Path(cluster.dir))
    assert secret is not None
    keys = export_access(secret, gateway)
    s3 = boto3.client("s3", endpoint_url=gateway, aws_access_key_id=keys.access_key,
                      aws_secret_access_key=keys.secret_key, region_name=keys.region,
                      config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}), verify=cluster.ca)
    summary = json.loads(s3.get_object(Bucket=EXPORT_BUCKET, Key="inspect/summary.json")["Body"].read())
    assert summary["disks_unavailable"] == [] and summary["unrecoverable"] == 0
    assert summary["blobs_scanned"] >= len(stored)
    listed = s3.list_objects_v2(Bucket=EXPORT_BUCKET, Prefix="inspect/input/manifests/")["Contents"]
    disks = sum(1 for p in cluster.processes if p.role == "blobnode") * SMALL.shape.disks_per_node
    assert len([entry for entry in listed if entry["Key"].endswith(".json")]) == disks
    written_by_spark = s3.list_objects_v2(Bucket=EXPORT_BUCKET, Prefix="inspect/findings/")["Contents"]
    assert any(entry["Key"].endswith("_SUCCESS") for entry in written_by_spark)
