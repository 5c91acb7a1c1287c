"""`--repair`: turn findings into repair and delete messages and queue them through mqproxy, paced.

A blob with missing or corrupt shards gets one repair message naming them all (the priority topic when more
than one is bad, as CubeFS does); a partial delete gets a delete message, so tinker finishes it after the
safe delay. Dry run unless asked: the inspection only reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from blobstore_server.libs.proto.export import spark_path
from blobstore_server.libs.proto.mqproxy import DeleteIn, RepairIn
from blobstore_server.services.mqproxy.client import MqProxyClient
from blobstore_server.spark.rules import DELETABLE, FINDING_DDL, REPAIRABLE

BATCH = 100


@dataclass
class Queued:
    repairs: int = 0
    deletes: int = 0


def requests(spark: SparkSession, out: str) -> Iterator[RepairIn | DeleteIn]:
    """One message per blob with a repairable or deletable finding, streamed from the findings table."""
    findings = spark.read.schema(FINDING_DDL).parquet(spark_path(out, "findings"))
    wanted = [f.value for f in (*REPAIRABLE, *DELETABLE)]
    rows = (findings.filter(F.col("finding").isin(wanted))
            .groupBy("vid", "bid").agg(F.collect_set("finding").alias("kinds"),
                                       F.sort_array(F.collect_set("unit_index")).alias("indexes")))
    for row in rows.toLocalIterator():
        if any(kind in DELETABLE for kind in row["kinds"]):
            yield DeleteIn(vid=row["vid"], bid=row["bid"])
        elif row["indexes"]:
            yield RepairIn(vid=row["vid"], bid=row["bid"], bad_indexes=row["indexes"], reason="inspect",
                           priority=len(row["indexes"]) > 1)


def _batches(items: Iterable[RepairIn | DeleteIn]) -> Iterator[list[RepairIn | DeleteIn]]:
    batch: list[RepairIn | DeleteIn] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def send(client: MqProxyClient, batch: list[RepairIn | DeleteIn]) -> Queued:
    repairs = [m for m in batch if isinstance(m, RepairIn)]
    deletes = [m for m in batch if isinstance(m, DeleteIn)]
    done = Queued()
    if repairs:
        done.repairs = await client.send_repair(repairs)
    if deletes:
        done.deletes = await client.send_delete(deletes)
    return done


def queue_all(loop: asyncio.AbstractEventLoop, client: MqProxyClient, items: Iterable[RepairIn | DeleteIn],
              rate: float) -> Queued:
    """Send everything in batches, at most `rate` messages per second; `loop` runs the client's calls."""
    total, start = Queued(), time.monotonic()
    for batch in _batches(items):
        done = loop.run_until_complete(send(client, batch))
        total.repairs += done.repairs
        total.deletes += done.deletes
        ahead = start + (total.repairs + total.deletes) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    return total
