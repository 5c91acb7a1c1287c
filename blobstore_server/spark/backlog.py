"""The repair backlog: what waits in Kafka and in the scheduler's task records, and how fast it drains.

Kafka: for each repair and delete topic, the messages between tinker's committed offset and the end offset
(read with Spark's Kafka source, so a backlog of millions is read by the executors, not the driver). Task
records: `task/...` in clustermgr's kv (libs/proto/scheduler.py). Writes `items` (one row per queued message
or open task, per disk it touches), `by_type`, `by_disk`, `by_volume`, `by_age` as Parquet and
`summary.json` (e.g. `{"shard_repair": {"backlog": 42, ...}}`) under `out`.

Throughput: Kafka positions are sampled before and after the job (messages committed in between per second);
for task records, the records that reached a final state within `window` seconds. ETA = backlog / rate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from pydantic import ValidationError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from blobstore_server.libs.mq.admin import positions
from blobstore_server.libs.mq.settings import KafkaAuth, client_auth, java_client_auth
from blobstore_server.libs.mq.topics import Topic, pipelines
from blobstore_server.libs.proto.export import open_target
from blobstore_server.libs.proto.scheduler import FINAL_STATES, TASK_PREFIX, TaskRecord
from blobstore_server.libs.proto.switches import TaskType, switch_states
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.spark.inputs import unit_rows
from blobstore_server.spark.inspect import write_text

log = logging.getLogger(__name__)

TOPIC_TASK = {Topic.SHARD_REPAIR: TaskType.SHARD_REPAIR, Topic.SHARD_REPAIR_PRIOR: TaskType.SHARD_REPAIR,
              Topic.SHARD_REPAIR_FAILED: TaskType.SHARD_REPAIR, Topic.BLOB_DELETE: TaskType.BLOB_DELETE,
              Topic.BLOB_DELETE_FAILED: TaskType.BLOB_DELETE, Topic.UPLOAD_RECLAIM: TaskType.BLOB_DELETE}
MESSAGE_DDL = ("cluster_id long, vid long, bid long, retry int, not_before double, bad_indexes array<int>, "
               "reason string, time double")
# One row per queued message or open task; `indexes` are the shards it is about (a delete: none).
ENTRY_DDL = ("task_type string, source string, topic string, vid long, bid long, indexes array<int>, disk_id long, "
             "state string, age_s double, retry int")
AGE_BUCKETS = ((60, "<1m"), (600, "1-10m"), (3600, "10m-1h"), (6 * 3600, "1-6h"))
OLDEST_BUCKET = ">6h"

Positions = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> (committed position, end offset)


@dataclass(frozen=True)
class BacklogOptions:
    bootstrap: str
    cluster_id: int
    group_prefix: str = "tinker"
    window: float = 3600.0  # seconds of finished task records that make the task rate
    stall_after: float = 300.0  # backlog older than this that does not drain is stalled; a task not moved, stuck
    auth: KafkaAuth | None = None  # the SASL login (the read-only backlog user); None: PLAINTEXT


@dataclass
class BacklogInput:
    """What the driver gathered before the job: positions at t0, task records, switch states, units."""

    positions: Positions
    sampled_at: float
    tasks: list[TaskRecord]
    invalid_tasks: int
    paused: dict[TaskType, bool]
    units_file: str
    later: Positions = field(default_factory=dict)  # positions sampled again after the job
    later_at: float = 0.0


def sample_positions(options: BacklogOptions) -> Positions:
    """Where tinker's groups stand on every repair and delete topic, and the end offsets."""
    found: Positions = {}
    for spec in pipelines(options.group_prefix):
        found.update(positions(options.bootstrap, spec.group, [str(t) for t in spec.topics],
                               client=client_auth(options.auth)))
    return found


async def gather(cluster: ClusterClient, options: BacklogOptions, out: str) -> BacklogInput:
    """Everything the job needs from clustermgr (tasks, switches, units) and Kafka (positions), read now."""
    raw = await cluster.kv_list(TASK_PREFIX)
    tasks, invalid = [], 0
    for key, value in raw.items():
        try:
            tasks.append(TaskRecord.model_validate_json(value))
        except ValidationError as exc:
            log.warning("skipping task record %s: %s", key, str(exc).splitlines()[0])
            invalid += 1
    states = switch_states(await cluster.list_config())
    filesystem, base = open_target(out)
    filesystem.create_dir(f"{base}/input", recursive=True)
    pq.write_table(unit_rows(await cluster.list_volumes()), f"{base}/input/units.parquet", filesystem=filesystem)
    sampled = await asyncio.to_thread(sample_positions, options)
    return BacklogInput(sampled, time.time(), tasks, invalid, {task: not on for task, on in states.items()},
                        f"{out.rstrip('/')}/input/units.parquet")


def age_bucket(age: Column) -> Column:
    column = F.when(age < AGE_BUCKETS[0][0], AGE_BUCKETS[0][1])
    for limit, name in AGE_BUCKETS[1:]:
        column = column.when(age < limit, name)
    return column.otherwise(OLDEST_BUCKET)


def _offsets_json(positions: Positions, pick: int) -> str:
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, partition), pair in positions.items():
        by_topic.setdefault(topic, {})[str(partition)] = pair[pick]
    return json.dumps(by_topic)


def _java_login(auth: KafkaAuth | None) -> dict[str, str]:
    """The Kafka source's options (the Java client's settings, prefixed `kafka.`) that log in as `auth`."""
    if auth is None:
        return {}
    return {f"kafka.{key}": value for key, value in java_client_auth(auth).items()}


def _messages(spark: SparkSession, options: BacklogOptions, positions: Positions, now: float) -> DataFrame:
    """One entry per unconsumed message of this cluster, read by the executors with Spark's Kafka source."""
    waiting = {tp: pair for tp, pair in positions.items() if pair[1] > pair[0]}
    if not waiting:
        return spark.createDataFrame([], ENTRY_DDL)
    assign = {topic: sorted(p for t, p in waiting if t == topic) for topic, _ in waiting}
    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", options.bootstrap)
           .options(**_java_login(options.auth)).option("assign", json.dumps(assign))
           .option("startingOffsets", _offsets_json(waiting, 0)).option("endingOffsets", _offsets_json(waiting, 1))
           .load())
    task = F.lit(None).cast("string")
    for topic, task_type in TOPIC_TASK.items():
        task = F.when(F.col("topic") == topic.value, task_type.value).otherwise(task)
    parsed = (raw.select("topic", "timestamp", F.from_json(F.col("value").cast("string"), MESSAGE_DDL).alias("m"))
              .filter(F.col("m.cluster_id") == options.cluster_id))
    return parsed.select(task.alias("task_type"), F.lit("kafka").alias("source"), "topic", F.col("m.vid").alias("vid"),
                         F.col("m.bid").alias("bid"), F.col("m.bad_indexes").alias("indexes"),
                         F.lit(None).cast("long").alias("disk_id"), F.lit("queued").alias("state"),
                         (F.lit(now) - F.col("timestamp").cast("double")).alias("age_s"),
                         F.col("m.retry").alias("retry"))


def _tasks(spark: SparkSession, tasks: list[TaskRecord], now: float) -> DataFrame:
    rows = [(t.task_type.value, "task", None, t.vid, None, [t.unit_index], t.disk_id, t.state.value, now - t.ctime,
             None) for t in tasks if t.open]
    return spark.createDataFrame(rows, ENTRY_DDL)


def _rate_kafka(before: Positions, after: Positions, seconds: float) -> dict[TaskType, float]:
    done: dict[TaskType, int] = {}
    for tp, (position, _) in after.items():
        task = TOPIC_TASK[Topic(tp[0])]
        done[task] = done.get(task, 0) + max(0, position - before.get(tp, (position, 0))[0])
    return {task: n / seconds for task, n in done.items()} if seconds > 0 else {}


def backlog(spark: SparkSession, gathered: BacklogInput, out: str, options: BacklogOptions) -> dict[str, Any]:
    """Run the report; Kafka positions are sampled again afterwards for the drain rate."""
    now = gathered.sampled_at
    units = spark.read.parquet(gathered.units_file).filter(~F.col("pending")).select("vid", "unit_index", "disk_id",
                                                                                     "host")
    entries = (_messages(spark, options, gathered.positions, now).unionByName(_tasks(spark, gathered.tasks, now))
               .withColumn("age_bucket", age_bucket(F.col("age_s"))).persist())
    # Per shard: the disk and host it sits on (a message names shard indexes; its units say where they are).
    items = (entries.withColumn("unit_index", F.explode_outer("indexes")).drop("indexes")
             .join(F.broadcast(units.withColumnRenamed("disk_id", "unit_disk")), ["vid", "unit_index"], "left")
             .withColumn("disk_id", F.coalesce("disk_id", "unit_disk")).drop("unit_disk"))
    base = out.rstrip("/")
    by_type = entries.groupBy("task_type").agg(F.count("*").alias("backlog"), F.max("age_s").alias("oldest_age_s"))
    by_age = entries.groupBy("task_type", "age_bucket").count()
    by_disk = items.filter(F.col("disk_id").isNotNull()).groupBy("task_type", "disk_id", "host").count()
    by_volume = entries.groupBy("task_type", "vid").count()
    for name, frame in (("items", items), ("by_type", by_type), ("by_age", by_age), ("by_disk", by_disk),
                        ("by_volume", by_volume)):
        frame.write.mode("overwrite").parquet(f"{base}/{name}")
    newest_first = F.max_by(F.struct("source", "topic", "vid", "bid", "age_s"), "age_s")
    oldest = {r["task_type"]: r["oldest"].asDict() for r in entries.groupBy("task_type")
              .agg(newest_first.alias("oldest")).collect()}
    totals = {r["task_type"]: r.asDict() for r in by_type.collect()}
    ages: dict[str, dict[str, int]] = {}
    for r in by_age.collect():
        ages.setdefault(r["task_type"], {})[r["age_bucket"]] = r["count"]
    disks = {r["task_type"]: r["n"] for r in by_disk.groupBy("task_type").agg(F.countDistinct("disk_id").alias("n"))
             .collect()}
    entries.unpersist()
    gathered.later, gathered.later_at = sample_positions(options), time.time()
    rates = _rate_kafka(gathered.positions, gathered.later, gathered.later_at - gathered.sampled_at)
    finished = [t for t in gathered.tasks if t.state in FINAL_STATES and t.mtime >= now - options.window]
    summary: dict[str, Any] = {}
    for task in TaskType:
        total = totals.get(task.value, {"backlog": 0, "oldest_age_s": None})
        rate = rates.get(task) if task in (TaskType.SHARD_REPAIR, TaskType.BLOB_DELETE) else \
            sum(t.task_type is task for t in finished) / options.window
        rate = rate or 0.0
        stuck = sum(t.open and t.task_type is task and now - t.mtime > options.stall_after for t in gathered.tasks)
        oldest_age = total["oldest_age_s"]
        summary[task.value] = {
            "backlog": total["backlog"],
            "oldest_age_s": oldest_age,
            "oldest": oldest.get(task.value),
            "by_age": ages.get(task.value, {}),
            "disks": disks.get(task.value, 0),
            "rate_per_s": rate,
            "eta_s": total["backlog"] / rate if rate > 0 else (0.0 if not total["backlog"] else None),
            "paused": gathered.paused.get(task, False),
            "stalled": bool(total["backlog"]) and rate == 0 and (oldest_age or 0) > options.stall_after,
            "stuck_tasks": stuck,
        }
    summary["generated_at"] = now
    summary["invalid_task_records"] = gathered.invalid_tasks
    write_text(out, "summary.json", json.dumps(summary, indent=2, sort_keys=True))
    return summary
