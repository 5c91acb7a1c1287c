"""What a blobnode's inspection export is, for the blobnodes that write it and the Spark jobs that read it.

Layout under the export's target, a folder or (on several hosts) s3://blobstore-inspect/... on the cluster's S3
gateway, the same for every blobnode, so one Spark job reads them all:

    shards/disk-<id>.parquet     one row per index entry; a row group per piece of the scan
    chunks/disk-<id>.parquet     one row per live chunk (orphan units are chunks clustermgr does not know)
    manifests/disk-<id>.json     `DiskExport` (libs/proto/blobnode.py), written last and removed first

pyarrow is a server dependency: nothing the SDK imports loads this module.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pyarrow as pa
from pyarrow import fs as pafs

from blobstore_server.libs.proto.blobnode import S3Access
from blobstore_server.libs.rpc.errors import BadRequest

# Spark has no unsigned types: u32 fields are int64; bids are int64 (clustermgr's bid scope stays far below
# 2^63); a vuid is (vid, unit_index, epoch).
SHARD_SCHEMA = pa.schema([("disk_id", pa.int64()), ("vid", pa.int64()), ("unit_index", pa.int32()),
                          ("epoch", pa.int32()), ("bid", pa.int64()), ("size", pa.int64()), ("crc", pa.int64()),
                          ("deleted", pa.bool_()), ("written_at", pa.int64()), ("marked_at", pa.int64())])
CHUNK_SCHEMA = pa.schema([("disk_id", pa.int64()), ("vid", pa.int64()), ("unit_index", pa.int32()),
                          ("epoch", pa.int32()), ("chunk_id", pa.string()), ("status", pa.string()),
                          ("created", pa.float64())])


def open_target(target: str, s3: S3Access | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and base path of an export target, an s3:// one reached through `s3`; BadRequest for a
    relative path, an unknown scheme, or s3:// without `s3`."""
    if "://" not in target and not target.startswith("/"):
        raise BadRequest(f"export target {target!r} must be an absolute path or a URI")
    if target.startswith("s3://"):
        if s3 is None:
            raise BadRequest(f"export target {target!r}: no S3 endpoint and user configured for s3:// targets")
        endpoint = urlsplit(s3.endpoint)
        filesystem = pafs.S3FileSystem(access_key=s3.access_key, secret_key=s3.secret_key, region=s3.region,
                                       scheme=endpoint.scheme, endpoint_override=endpoint.netloc,
                                       tls_ca_file_path=s3.ca_file)
        return filesystem, target.removeprefix("s3://").rstrip("/")
    try:
        filesystem, path = pafs.FileSystem.from_uri(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise BadRequest(f"export target {target!r}: {exc}") from None
    return filesystem, path.rstrip("/")


def spark_path(target: str, relative: str = "") -> str:
    """`relative` under `target` as Spark names it: Hadoop reads S3 as s3a://."""
    base = target.rstrip("/")
    base = "s3a://" + base.removeprefix("s3://") if base.startswith("s3://") else base
    return f"{base}/{relative}" if relative else base


def s3a_options(s3: S3Access) -> dict[str, str]:
    """Hadoop's settings for s3a:// paths on `s3`'s endpoint (path-style, its one user)."""
    return {"fs.s3a.endpoint": s3.endpoint, "fs.s3a.endpoint.region": s3.region,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": str(s3.endpoint.startswith("https://")).lower(),
            "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "fs.s3a.access.key": s3.access_key, "fs.s3a.secret.key": s3.secret_key}


def manifest_path(disk_id: int) -> str:
    return f"manifests/disk-{disk_id}.json"


def shard_path(disk_id: int) -> str:
    return f"shards/disk-{disk_id}.parquet"


def chunk_path(disk_id: int) -> str:
    return f"chunks/disk-{disk_id}.parquet"
