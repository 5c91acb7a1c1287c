"""The inspection's input folder: clustermgr's tables and every disk's exported index, as Parquet.

    cluster/units.parquet     one row per volume unit (pending units of a migration too), from clustermgr
    cluster/disks.parquet     one row per disk clustermgr knows
    cluster/manifest.json     when the tables were read
    shards/, chunks/, manifests/   written by each blobnode (services/blobnode/export.py)

`export_all` fills the folder through the typed clients (clustermgr is only read); `load_inputs` decides,
disk by disk, whether its export can be used: a disk without a manifest, or whose files do not match it,
is *unavailable* (its units are unknown to the job, never counted as empty).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pydantic import ValidationError

from blobstore_server.libs.ec import tactic
from blobstore_server.libs.proto.blobnode import DiskExport, S3Access
from blobstore_server.libs.proto.cluster import VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.export import manifest_path, open_target, spark_path
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import Forbidden, RpcError, Unauthorized
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient

UNIT_SCHEMA = pa.schema([("vid", pa.int64()), ("unit_index", pa.int32()), ("epoch", pa.int32()),
                         ("disk_id", pa.int64()), ("host", pa.string()), ("code_mode", pa.string()),
                         ("backend", pa.string()), ("n", pa.int32()), ("total", pa.int32()), ("status", pa.string()),
                         ("migrating", pa.bool_()), ("pending", pa.bool_())])
DISK_SCHEMA = pa.schema([("disk_id", pa.int64()), ("host", pa.string()), ("idc", pa.string()),
                         ("rack", pa.string()), ("status", pa.string()), ("alive", pa.bool_())])


_SPARK_TYPES = {pa.int64(): "long", pa.int32(): "int", pa.string(): "string", pa.bool_(): "boolean",
                pa.float64(): "double"}


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark schema of a table we write with pyarrow (to read a set of files that may be empty)."""
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


def unit_rows(volumes: Sequence[VolumeInfo]) -> pa.Table:
    """Every unit of every volume; a locked volume or one with a unit being moved in counts as migrating."""
    rows: dict[str, list[object]] = {name: [] for name in UNIT_SCHEMA.names}
    for volume in volumes:
        shape, mode = tactic(volume.code_mode), volume.code_mode.name
        migrating = volume.status is VolumeStatus.LOCK or bool(volume.pending_units)
        units = [(i, u, False) for i, u in enumerate(volume.units)]
        units += [(i, u, True) for i, u in volume.pending_units.items()]
        for index, unit, pending in units:
            for name, value in (("vid", volume.vid), ("unit_index", index), ("epoch", Vuid(unit.vuid).epoch()),
                                ("disk_id", unit.disk_id), ("host", unit.host), ("code_mode", mode),
                                ("backend", volume.backend), ("n", shape.n), ("total", shape.total),
                                ("status", volume.status.value), ("migrating", migrating), ("pending", pending)):
                rows[name].append(value)
    return pa.table(rows, schema=UNIT_SCHEMA)


def disk_rows(disks: list[DiskView]) -> pa.Table:
    return pa.table({"disk_id": [d.disk_id for d in disks], "host": [d.host for d in disks],
                     "idc": [d.idc for d in disks], "rack": [d.rack for d in disks],
                     "status": [d.status.value for d in disks], "alive": [d.alive for d in disks]},
                    schema=DISK_SCHEMA)


@dataclass
class ExportReport:
    exported_at: float
    volumes: int
    disks: int
    failed_hosts: dict[str, str] = field(default_factory=dict)  # blobnode URL -> why its export failed


async def export_all(cluster: ClusterClient, blobnodes: BlobnodeClient, target: str,
                     timeout: float = 600.0, s3: S3Access | None = None) -> ExportReport:
    """clustermgr's tables, then every blobnode's disks at once into `target`. A blobnode that fails or does not
    answer within `timeout` is reported; its disks stay unavailable. A refusal (401, 403) is raised: it is the
    caller's credentials, not the node, that failed. An s3:// target is written as `s3` here, and as each
    blobnode's configured user there."""
    filesystem, base = open_target(target, s3)
    filesystem.create_dir(f"{base}/cluster", recursive=True)
    exported_at = time.time()
    volumes, disks = await cluster.list_volumes(), await cluster.list_disks()
    pq.write_table(unit_rows(volumes), f"{base}/cluster/units.parquet", filesystem=filesystem)
    pq.write_table(disk_rows(disks), f"{base}/cluster/disks.parquet", filesystem=filesystem)
    with filesystem.open_output_stream(f"{base}/cluster/manifest.json") as out:
        out.write(json.dumps({"exported_at": exported_at, "volumes": len(volumes), "disks": len(disks)}).encode())
    report = ExportReport(exported_at, len(volumes), len(disks))
    hosts = sorted({d.host for d in disks})
    outcomes = await asyncio.gather(*(blobnodes.export(host, target, timeout=timeout) for host in hosts),
                                    return_exceptions=True)
    for host, outcome in zip(hosts, outcomes, strict=True):
        if isinstance(outcome, Unauthorized | Forbidden):
            raise outcome
        if isinstance(outcome, RpcError):
            report.failed_hosts[host] = f"{type(outcome).__name__}: {outcome}"
        elif isinstance(outcome, BaseException):
            raise outcome
    return report


@dataclass(frozen=True)
class Inputs:
    """What the job reads: file paths (as Spark names them) and the verdict on every disk."""

    target: str
    units_file: str
    disks_file: str
    exported_at: float
    shard_files: list[str]
    chunk_files: list[str]
    available: dict[int, DiskExport]  # disk id -> its manifest
    unavailable: dict[int, str]  # disk id -> why
    hosts: dict[int, str]  # disk id -> blobnode URL

    @property
    def shards(self) -> int:
        return sum(manifest.shards for manifest in self.available.values())

    def shuffle_partitions(self, rows_each: int = 1_000_000) -> int:
        """Spark's shuffle partitions for this input: about `rows_each` shard rows each, at least 4 (Spark's default
        of 200 makes a small cluster's job wait on thousands of empty tasks)."""
        return max(4, self.shards // rows_each)


def _check_export(filesystem: pafs.FileSystem, base: str, disk_id: int) -> DiskExport | str:
    """The disk's manifest if its files are all there and hold what it says; otherwise why not."""
    try:
        with filesystem.open_input_stream(f"{base}/{manifest_path(disk_id)}") as f:
            manifest = DiskExport.model_validate_json(f.read())
    except FileNotFoundError:
        return "no export (its blobnode did not export it: down, unreachable or still exporting)"
    except (OSError, ValidationError) as exc:
        return f"manifest unreadable: {str(exc).splitlines()[0]}"
    if manifest.disk_id != disk_id:
        return f"manifest names disk {manifest.disk_id}"
    for relative, rows in ((manifest.shard_file, manifest.shards), (manifest.chunk_file, manifest.chunks)):
        try:
            found = pq.read_metadata(f"{base}/{relative}", filesystem=filesystem).num_rows
        except (OSError, pa.ArrowException) as exc:
            return f"export file {relative} unreadable: {str(exc).splitlines()[0]}"
        if found != rows:
            return f"export file {relative} holds {found} rows, its manifest says {rows}"
    return manifest


def load_inputs(target: str, s3: S3Access | None = None) -> Inputs:
    """Read the cluster tables and judge every disk clustermgr knows (footers only: cheap for any size)."""
    filesystem, base = open_target(target, s3)
    try:
        with filesystem.open_input_stream(f"{base}/cluster/manifest.json") as f:
            exported_at = float(json.loads(f.read())["exported_at"])
        disks = pq.read_table(f"{base}/cluster/disks.parquet", filesystem=filesystem).to_pylist()
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
        raise ValueError(f"{target} holds no readable clustermgr export: {exc}") from None
    available: dict[int, DiskExport] = {}
    unavailable: dict[int, str] = {}
    for disk in disks:
        verdict = _check_export(filesystem, base, disk["disk_id"])
        if isinstance(verdict, DiskExport):
            available[disk["disk_id"]] = verdict
        else:
            unavailable[disk["disk_id"]] = verdict
    files: dict[str, list[str]] = defaultdict(list)
    for manifest in available.values():
        files["shards"].append(spark_path(target, manifest.shard_file))
        files["chunks"].append(spark_path(target, manifest.chunk_file))
    return Inputs(target, spark_path(target, "cluster/units.parquet"), spark_path(target, "cluster/disks.parquet"),
                  exported_at, files["shards"], files["chunks"], available, unavailable,
                  {d["disk_id"]: d["host"] for d in disks})
