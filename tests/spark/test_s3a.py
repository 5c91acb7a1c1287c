"""Spark and the S3 gateway, the data-lake way: a Parquet file that boto3 put into a bucket is read by Spark through
s3a://, and the dataset Spark writes back (multipart uploads, its committer's renames as copy + delete, directory
probes, delimited listings) is read by boto3 and pyarrow, row for row."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from tests.support.processes import LocalCluster
from tests.support.s3 import Gateway, running_gateway
from tests.support.spark import s3a_options

ROWS = 400_000  # two columns of random doubles: ~8 MiB of Parquet, a multipart upload in two parts


@pytest.fixture
def gateway(shared_cluster: LocalCluster, tmp_path: Path) -> Iterator[Gateway]:
    with running_gateway(shared_cluster, tmp_path) as started:
        yield started


def readings() -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table({"id": np.arange(ROWS, dtype=np.int64), "host": [f"h{i % 13}" for i in range(ROWS)],
                     "load": rng.random(ROWS), "temp": rng.normal(40, 5, ROWS)})


def test_spark_reads_what_boto3_put_and_writes_a_dataset_boto3_reads(spark: SparkSession, gateway: Gateway) -> None:
    keys = gateway.user("lake")
    s3 = gateway.client(*keys)
    s3.create_bucket(Bucket="lake")
    table = readings()
    sink = io.BytesIO()
    pq.write_table(table, sink)
    s3.put_object(Bucket="lake", Key="in/readings.parquet", Body=sink.getvalue())
    options = s3a_options(gateway.url, *keys)

    frame = spark.read.options(**options).parquet("s3a://lake/in/readings.parquet")
    assert frame.orderBy("id").toArrow().equals(table)

    # One file of ~8 MiB, written as a multipart upload under out/_temporary/, then renamed (copied) into place
    # by the task's and the job's commits, the attempt directories deleted and out/_SUCCESS written.
    frame.where("host != 'h0'").coalesce(1).write.options(**options).parquet("s3a://lake/out/")
    listed = s3.list_objects_v2(Bucket="lake", Prefix="out/")["Contents"]
    names = sorted(entry["Key"] for entry in listed)
    parts = [name for name in names if name.endswith(".parquet")]
    assert names == ["out/_SUCCESS", *parts] and len(parts) == 1
    written = pq.read_table(io.BytesIO(s3.get_object(Bucket="lake", Key=parts[0])["Body"].read()))
    expected = table.filter(pc.field("host") != "h0")
    assert written.sort_by("id").equals(expected)
    assert spark.read.options(**options).parquet("s3a://lake/out/").count() == expected.num_rows
