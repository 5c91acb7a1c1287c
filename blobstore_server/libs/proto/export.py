"""What a blobnode's inspection export is, for the blobnodes that write it and the Spark jobs that read it.

Layout under the export's target (the same for every blobnode, so one Spark job reads them all):

    shards/disk-<id>.parquet     one row per index entry; a row group per piece of the scan
    chunks/disk-<id>.parquet     one row per live chunk (orphan units are chunks clustermgr does not know)
    manifests/disk-<id>.json     `DiskExport` (libs/proto/blobnode.py), written last and removed first

pyarrow is a server dependency: nothing the SDK imports loads this module.
"""

from __future__ import annotations

import pyarrow as pa
from pyarrow import fs as pafs

from blobstore_server.libs.rpc.errors import BadRequest

# Spark has no unsigned types: u32 fields are int64; bids are int64 (clustermgr's bid scope stays far below
# 2^63); a vuid is (vid, unit_index, epoch).
SHARD_SCHEMA = pa.schema([("disk_id", pa.int64()), ("vid", pa.int64()), ("unit_index", pa.int32()),
                          ("epoch", pa.int32()), ("bid", pa.int64()), ("size", pa.int64()), ("crc", pa.int64()),
                          ("deleted", pa.bool_()), ("written_at", pa.int64()), ("marked_at", pa.int64())])
CHUNK_SCHEMA = pa.schema([("disk_id", pa.int64()), ("vid", pa.int64()), ("unit_index", pa.int32()),
                          ("epoch", pa.int32()), ("chunk_id", pa.string()), ("status", pa.string()),
                          ("created", pa.float64())])


def open_target(target: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and base path of an export target; BadRequest for a relative path or unknown scheme."""
    if "://" not in target and not target.startswith("/"):
        raise BadRequest(f"export target {target!r} must be an absolute path or a URI")
    try:
        filesystem, path = pafs.FileSystem.from_uri(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise BadRequest(f"export target {target!r}: {exc}") from None
    return filesystem, path.rstrip("/")


def manifest_path(disk_id: int) -> str:
    return f"manifests/disk-{disk_id}.json"


def shard_path(disk_id: int) -> str:
    return f"shards/disk-{disk_id}.parquet"


def chunk_path(disk_id: int) -> str:
    return f"chunks/disk-{disk_id}.parquet"
