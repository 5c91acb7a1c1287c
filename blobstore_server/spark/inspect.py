"""The offline volume inspection: join every disk's shard index to clustermgr's units, judge each blob.

Reads an input folder (spark/inputs.py), writes `findings/finding=<type>/*.parquet` and `summary.json` under
`out`. Volumes being migrated (locked, or with a unit being moved in) are skipped, and so are blobs written
or marked deleted after the cutoff (export time less `settle` seconds): a PUT or delete may be under way.

    blobstore inspect run [--out DIR] [--master URL] [--deep] [--repair]     (exports first, then this job)
    spark-submit spark/inspect.py --input DIR --out DIR [--deep]              (over an existing export)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from typing import Any

from pyarrow import fs as pafs
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from blobstore_server.libs.proto.blobnode import S3Access
from blobstore_server.libs.proto.export import CHUNK_SCHEMA, SHARD_SCHEMA, open_target, spark_path
from blobstore_server.libs.rpc.auth import Grant
from blobstore_server.spark.inputs import UNIT_SCHEMA, Inputs, load_inputs, spark_ddl
from blobstore_server.spark.rules import (
    AT_RISK,
    DEEP,
    FINDING_DDL,
    BlobState,
    Finding,
    blob_state,
    has_bit,
    missing_mask,
    unit_bit,
    unknown_mask,
)

FINDING_COLUMNS = [c.split()[0] for c in FINDING_DDL.split(", ")]
UNIT_KEY = ["vid", "unit_index", "epoch", "disk_id"]


@dataclass(frozen=True)
class InspectOptions:
    settle: float = 600.0  # seconds before the export during which a write or mark-delete counts as in flight
    delete_delay: float = 4 * 3600.0  # tinker's safe delay: mark-deleted for longer than this is "not purged"
    deep: bool = False
    deep_rate: float = 32 << 20  # bytes/s of shard reads per executor task in --deep
    deep_grant: Grant | None = None  # signs the executors' shard reads (None: the cluster does not sign)
    deep_ca: str | None = None  # the cluster CA's certificate (PEM) the executors check https blobnodes against
    s3: S3Access | None = None  # whom an s3:// output is written as (Spark's session has the same, for s3a://)


def _read(spark: SparkSession, files: list[str], ddl: str) -> DataFrame:
    return spark.read.schema(ddl).parquet(*files) if files else spark.createDataFrame([], ddl)


def _findings(df: DataFrame, finding: Finding | Column, **columns: Column) -> DataFrame:
    """Rows of the findings table: the given columns, the rest null."""
    kind = F.lit(finding.value) if isinstance(finding, Finding) else finding
    types = dict(c.split() for c in FINDING_DDL.split(", "))
    picked = {"finding": kind, **columns}
    return df.select(*(picked.get(name, F.lit(None)).cast(types[name]).alias(name) for name in FINDING_COLUMNS))


def _blobs(units: DataFrame, shards: DataFrame, available: DataFrame, cutoff: float,
           purge_before: float) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(volumes with their unit masks, current shards, one row per blob with its state)."""
    scanned = units.filter(~F.col("pending") & ~F.col("migrating"))
    index = F.col("unit_index")
    readable = F.when(F.col("readable"), unit_bit(index)).otherwise(0)
    volumes = (scanned.join(available.withColumn("readable", F.lit(True)), "disk_id", "left")
               .groupBy("vid").agg(F.first("code_mode").alias("code_mode"), F.first("backend").alias("backend"),
                                   F.first("n").alias("n"), F.bit_or(unit_bit(index)).alias("unit_mask"),
                                   F.bit_or(readable).alias("avail_mask")))
    current = shards.join(F.broadcast(scanned.select(*UNIT_KEY, "host")), UNIT_KEY)
    deleted = F.col("deleted")
    blobs = (current.groupBy("vid", "bid")
             .agg(F.bit_or(F.when(~deleted, unit_bit(index)).otherwise(0)).alias("normal_mask"),
                  F.bit_or(F.when(deleted, unit_bit(index)).otherwise(0)).alias("deleted_mask"),
                  F.min(F.when(~deleted, F.col("size"))).alias("min_size"),
                  F.max(F.when(~deleted, F.col("size"))).alias("max_size"),
                  F.max("size").alias("size"), F.max("written_at").alias("written_at"),
                  F.max("marked_at").alias("marked_at"))
             .join(F.broadcast(volumes), "vid")
             .withColumn("state", blob_state(cutoff, purge_before)))
    return volumes, current, blobs


def _blob_findings(blobs: DataFrame) -> DataFrame:
    states = [BlobState.UNRECOVERABLE, BlobState.UNVERIFIED, BlobState.PARTIAL_DELETE, BlobState.NOT_PURGED]
    present = F.bit_count(F.col("normal_mask"))
    detail = F.format_string("%d of %d shards present (needs %d); %d on unavailable disks; %d mark-deleted",
                             present, F.bit_count(F.col("unit_mask")), F.col("n"), F.bit_count(unknown_mask()),
                             F.bit_count(F.col("deleted_mask")))
    return _findings(blobs.filter(F.col("state").isin([s.value for s in states])), F.col("state"), vid=F.col("vid"),
                     bid=F.col("bid"), code_mode=F.col("code_mode"), bytes=F.col("n") * F.col("size"), detail=detail)


def _missing_shards(blobs: DataFrame, units: DataFrame) -> DataFrame:
    index = F.col("unit_index")
    missing = (blobs.filter(F.col("state") == BlobState.MISSING.value)
               .select("vid", "bid", "code_mode", "size", missing_mask().alias("missing"),
                       F.explode(F.sequence(F.lit(0), F.bit_count(F.col("unit_mask")) - 1)).alias("unit_index"))
               .filter(has_bit(F.col("missing"), index))
               .join(F.broadcast(units.filter(~F.col("pending")).select("vid", "unit_index", "disk_id", "host")),
                     ["vid", "unit_index"]))
    return _findings(missing, Finding.MISSING_SHARDS, vid=F.col("vid"), bid=F.col("bid"), unit_index=index,
                     disk_id=F.col("disk_id"), host=F.col("host"), code_mode=F.col("code_mode"), bytes=F.col("size"))


def _has_size_mismatch(blobs: DataFrame) -> bool:
    return bool(blobs.filter(F.col("min_size") != F.col("max_size")).limit(1).count())


def _size_mismatches(blobs: DataFrame, current: DataFrame) -> DataFrame:
    """Shards whose size differs from the size most shards of the blob have."""
    odd = blobs.filter((F.col("min_size") != F.col("max_size")) & (F.col("state") != BlobState.RECENT.value))
    shards = current.filter(~F.col("deleted")).join(odd.select("vid", "bid", "code_mode"), ["vid", "bid"])
    votes = shards.groupBy("vid", "bid", "size").count()
    ranked = Window.partitionBy("vid", "bid").orderBy(F.desc("count"), F.desc("size"))
    majority = (votes.withColumn("rank", F.row_number().over(ranked)).filter(F.col("rank") == 1)
                .select("vid", "bid", F.col("size").alias("expected")))
    wrong = shards.join(majority, ["vid", "bid"]).filter(F.col("size") != F.col("expected"))
    return _findings(wrong, Finding.SIZE_MISMATCH, vid=F.col("vid"), bid=F.col("bid"), unit_index=F.col("unit_index"),
                     disk_id=F.col("disk_id"), host=F.col("host"), code_mode=F.col("code_mode"), bytes=F.col("size"),
                     detail=F.format_string("%d bytes; its siblings have %d", F.col("size"), F.col("expected")))


def _orphan_units(units: DataFrame, chunks: DataFrame, hosts: DataFrame, cutoff: float) -> DataFrame:
    """Chunks no unit names (a unit being moved in counts as named); volumes under migration are skipped."""
    migrating = units.filter(F.col("migrating")).select("vid").distinct()
    orphans = (chunks.filter(F.col("created") <= cutoff)
               .join(units.select(*UNIT_KEY), UNIT_KEY, "left_anti")
               .join(migrating, "vid", "left_anti")
               .join(F.broadcast(hosts), "disk_id", "left"))
    return _findings(orphans, Finding.ORPHAN_UNITS, vid=F.col("vid"), unit_index=F.col("unit_index"),
                     disk_id=F.col("disk_id"), host=F.col("host"),
                     detail=F.format_string("chunk %s (epoch %d) is no unit of volume %d",
                                            F.col("chunk_id"), F.col("epoch"), F.col("vid")))


def write_text(target: str, relative: str, text: str, s3: S3Access | None = None) -> None:
    filesystem, base = open_target(target, s3)
    filesystem.create_dir(base, recursive=True)
    with filesystem.open_output_stream(f"{base}/{relative}") as out:
        out.write(text.encode())


def _counts(rows: list[Any], key: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        if row[key] is not None:
            out.setdefault(str(row[key]), {})[row["finding"]] = row["count"]
    return out


def inspect(spark: SparkSession, inputs: Inputs, out: str, options: InspectOptions) -> dict[str, Any]:
    """Run the inspection; writes findings and summary.json under `out` and returns the summary. A summary left by
    an earlier run goes first: a job that fails leaves none, never an old one that could pass for its own."""
    filesystem, base = open_target(out, options.s3)
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_file(f"{base}/summary.json")
    cutoff = inputs.exported_at - options.settle
    purge_before = inputs.exported_at - options.delete_delay
    units = spark.read.schema(spark_ddl(UNIT_SCHEMA)).parquet(inputs.units_file)
    disks = spark.read.parquet(inputs.disks_file)
    available = spark.createDataFrame([(d,) for d in inputs.available], "disk_id long")
    shards = _read(spark, inputs.shard_files, spark_ddl(SHARD_SCHEMA))
    chunks = _read(spark, inputs.chunk_files, spark_ddl(CHUNK_SCHEMA))
    volumes, current, blobs = _blobs(units, shards, available, cutoff, purge_before)
    blobs = blobs.persist()
    parts = [_blob_findings(blobs), _missing_shards(blobs, units),
             _orphan_units(units, chunks, disks.select("disk_id", "host"), cutoff)]
    if _has_size_mismatch(blobs):  # rare: the shards are read a second time only then
        parts.append(_size_mismatches(blobs, current))
    if options.deep:
        from blobstore_server.spark.deep import deep_findings

        deep = deep_findings(blobs, current, options.deep_rate, options.deep_grant, options.deep_ca)
        parts.append(_findings(deep, F.col("finding"), **{c: F.col(c) for c in FINDING_COLUMNS if c != "finding"}))
    findings_path = spark_path(out, "findings")
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    union.write.mode("overwrite").partitionBy("finding").parquet(findings_path)
    findings = (spark.read.schema(FINDING_DDL).parquet(findings_path) if _has_files(out, options.s3)
                else spark.createDataFrame([], FINDING_DDL))
    by_type = {r["finding"]: r["count"] for r in findings.groupBy("finding").count().collect()}
    by_disk = findings.groupBy("disk_id", "finding").count().collect()
    by_host = findings.groupBy("host", "finding").count().collect()
    corrupt_bytes = findings.filter(F.col("finding") == Finding.CORRUPT_SHARDS.value).agg(F.sum("bytes")).first()
    states = {r["state"]: (r["count"], r["bytes"] or 0) for r in blobs.groupBy("state").agg(
        F.count("*").alias("count"), F.sum(F.col("n") * F.col("size")).alias("bytes")).collect()}
    volume_counts = volumes.agg(F.count("*").alias("all"),
                                F.sum((F.col("avail_mask") != F.col("unit_mask")).cast("int")).alias("partial")).first()
    skipped = units.filter(F.col("migrating")).select("vid").distinct().count()
    blobs.unpersist()
    summary: dict[str, Any] = {finding.value: by_type.get(finding.value, 0) for finding in Finding
                               if options.deep or finding not in DEEP}
    volumes_all = volume_counts["all"] if volume_counts else 0
    volumes_partial = (volume_counts["partial"] or 0) if volume_counts else 0
    summary.update({
        "by_disk": _counts(by_disk, "disk_id"),
        "by_host": _counts(by_host, "host"),
        "bytes_at_risk": sum(states.get(s.value, (0, 0))[1] for s in AT_RISK) + ((corrupt_bytes[0] or 0)
                                                                                  if corrupt_bytes else 0),
        "volumes_scanned": volumes_all - volumes_partial,
        "volumes_unavailable": volumes_partial,  # some unit's disk export is missing or unreadable
        "volumes_skipped": skipped,  # under migration
        "blobs_scanned": sum(count for state, (count, _) in states.items() if state != BlobState.RECENT.value),
        "blobs_recent": states.get(BlobState.RECENT.value, (0, 0))[0],
        "shards_scanned": inputs.shards,
        "disks_unavailable": [{"disk_id": disk_id, "host": inputs.hosts.get(disk_id, ""), "reason": reason}
                              for disk_id, reason in sorted(inputs.unavailable.items())],
        "exported_at": inputs.exported_at,
        "cutoff": cutoff,
        "deep": options.deep,
    })
    write_text(out, "summary.json", json.dumps(summary, indent=2, sort_keys=True), options.s3)
    return summary


def _has_files(out: str, s3: S3Access | None) -> bool:
    filesystem, base = open_target(out, s3)
    info = filesystem.get_file_info(pafs.FileSelector(f"{base}/findings", allow_not_found=True, recursive=True))
    return any(i.path.endswith(".parquet") for i in info)


def main(argv: list[str] | None = None) -> int:
    from blobstore_server.spark.session import spark_session

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="an export folder (blobstore inspect run writes one)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--deep", action="store_true")
    parser.add_argument("--settle", type=float, default=InspectOptions.settle)
    args = parser.parse_args(argv)
    with spark_session(args.master, "blobstore-inspect") as spark:
        summary = inspect(spark, load_inputs(args.input), args.out, InspectOptions(settle=args.settle, deep=args.deep))
    print(json.dumps(summary, indent=2))
    return 2 if summary[Finding.UNRECOVERABLE.value] else 0


if __name__ == "__main__":
    sys.exit(main())
