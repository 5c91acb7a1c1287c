"""Fetch Spark's Kafka source and Hadoop's S3A connector (and what they need beside pyspark's jars) into the
cache, once: `make setup` runs this, so that no job downloads anything. Needs Maven; later runs return at once.

    python deploy/spark/jars.py
"""

from __future__ import annotations

import sys

from blobstore_server.spark.session import fetch_kafka_source, fetch_s3a

if __name__ == "__main__":
    print(f"Spark's Kafka source: {fetch_kafka_source()}")
    print(f"Hadoop's S3A connector: {fetch_s3a()}")
    sys.exit(0)
