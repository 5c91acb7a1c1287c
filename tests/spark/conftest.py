"""One local SparkSession for the whole test session: the jobs (and the CLI run in-process) reuse it, so the
JVM starts once. The standalone-master test runs the CLI as real subprocesses instead."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from blobstore_server.spark.session import spark_session

LOCAL_CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.driver.memory": "1g"}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    with spark_session("local[2]", "blobstore-tests", LOCAL_CONF, kafka_source=True, s3a=True) as session:
        yield session
