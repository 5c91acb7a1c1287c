"""Which S3 operation a request is: path-style addressing, the method and the query's subresources.

Pure, so every combination is tested; anything S3 has that the gateway does not answers NotImplemented
(501), never a wrong 200 from the nearest operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from urllib.parse import parse_qsl, unquote_to_bytes

from blobstore_server.services.s3.errors import NOT_CONFIGURED, S3Error


class Op(Enum):
    LIST_BUCKETS = "ListBuckets"
    CREATE_BUCKET = "CreateBucket"
    HEAD_BUCKET = "HeadBucket"
    DELETE_BUCKET = "DeleteBucket"
    GET_BUCKET_LOCATION = "GetBucketLocation"
    GET_BUCKET_VERSIONING = "GetBucketVersioning"
    GET_BUCKET_CONFIGURATION = "GetBucketConfiguration"  # one the gateway never holds (errors.NOT_CONFIGURED)
    LIST_OBJECTS = "ListObjects"
    LIST_OBJECTS_V2 = "ListObjectsV2"
    LIST_OBJECT_VERSIONS = "ListObjectVersions"
    LIST_MULTIPART_UPLOADS = "ListMultipartUploads"
    DELETE_OBJECTS = "DeleteObjects"
    PUT_OBJECT = "PutObject"
    COPY_OBJECT = "CopyObject"
    GET_OBJECT = "GetObject"
    HEAD_OBJECT = "HeadObject"
    DELETE_OBJECT = "DeleteObject"
    CREATE_MULTIPART_UPLOAD = "CreateMultipartUpload"
    UPLOAD_PART = "UploadPart"
    UPLOAD_PART_COPY = "UploadPartCopy"
    COMPLETE_MULTIPART_UPLOAD = "CompleteMultipartUpload"
    ABORT_MULTIPART_UPLOAD = "AbortMultipartUpload"
    LIST_PARTS = "ListParts"


# Query parameters that select another operation on the same path (S3's subresources). A request carrying one
# the table below does not name is an operation the gateway does not have.
SUBRESOURCES = frozenset({
    "accelerate", "acl", "analytics", "attributes", "cors", "delete", "encryption", "intelligent-tiering",
    "inventory", "legal-hold", "lifecycle", "location", "logging", "metadataTable", "metrics", "notification",
    "object-lock", "ownershipControls", "partNumber", "policy", "policyStatus", "publicAccessBlock", "replication",
    "requestPayment", "restore", "retention", "select", "select-type", "session", "tagging", "torrent", "uploadId",
    "uploads", "versionId", "versioning", "versions", "website",
})

# (scope, method, subresources present, copy source header present) -> operation
_TABLE: dict[tuple[str, str, frozenset[str], bool], Op] = {
    ("service", "GET", frozenset(), False): Op.LIST_BUCKETS,
    ("bucket", "PUT", frozenset(), False): Op.CREATE_BUCKET,
    ("bucket", "HEAD", frozenset(), False): Op.HEAD_BUCKET,
    ("bucket", "DELETE", frozenset(), False): Op.DELETE_BUCKET,
    ("bucket", "GET", frozenset({"location"}), False): Op.GET_BUCKET_LOCATION,
    ("bucket", "GET", frozenset({"versioning"}), False): Op.GET_BUCKET_VERSIONING,
    ("bucket", "GET", frozenset(), False): Op.LIST_OBJECTS,
    ("bucket", "GET", frozenset({"versions"}), False): Op.LIST_OBJECT_VERSIONS,
    ("bucket", "GET", frozenset({"uploads"}), False): Op.LIST_MULTIPART_UPLOADS,
    ("bucket", "POST", frozenset({"delete"}), False): Op.DELETE_OBJECTS,
    ("object", "PUT", frozenset(), False): Op.PUT_OBJECT,
    ("object", "PUT", frozenset(), True): Op.COPY_OBJECT,
    ("object", "GET", frozenset(), False): Op.GET_OBJECT,
    ("object", "HEAD", frozenset(), False): Op.HEAD_OBJECT,
    ("object", "GET", frozenset({"partNumber"}), False): Op.GET_OBJECT,
    ("object", "HEAD", frozenset({"partNumber"}), False): Op.HEAD_OBJECT,
    ("object", "DELETE", frozenset(), False): Op.DELETE_OBJECT,
    ("object", "POST", frozenset({"uploads"}), False): Op.CREATE_MULTIPART_UPLOAD,
    ("object", "PUT", frozenset({"partNumber", "uploadId"}), False): Op.UPLOAD_PART,
    ("object", "PUT", frozenset({"partNumber", "uploadId"}), True): Op.UPLOAD_PART_COPY,
    ("object", "POST", frozenset({"uploadId"}), False): Op.COMPLETE_MULTIPART_UPLOAD,
    ("object", "DELETE", frozenset({"uploadId"}), False): Op.ABORT_MULTIPART_UPLOAD,
    ("object", "GET", frozenset({"uploadId"}), False): Op.LIST_PARTS,
    **{("bucket", "GET", frozenset({name}), False): Op.GET_BUCKET_CONFIGURATION for name in NOT_CONFIGURED},
}


@dataclass(frozen=True)
class Route:
    op: Op
    bucket: str  # "" for the service
    key: bytes  # b"" unless an object operation
    query: dict[str, str]  # the last value of each parameter, decoded

    @property
    def resource(self) -> str:
        """The path an error names (S3's Resource element)."""
        if not self.bucket:
            return "/"
        return f"/{self.bucket}" + (f"/{self.key.decode('utf-8', 'replace')}" if self.key else "")


def path_style(host: str, raw_path: str, domains: Sequence[str]) -> str:
    """The path-style path of a request: `/<bucket>` + its path when its Host (port aside) is `<bucket>.<domain>`
    for one of `domains` (virtual-hosted style), else its path as sent."""
    name = (host if host.endswith("]") else host.rsplit(":", 1)[0]).rstrip(".").lower()
    for domain in domains:
        suffix = "." + domain.rstrip(".").lower()
        if name.endswith(suffix) and len(name) > len(suffix):
            return f"/{name.removesuffix(suffix)}{raw_path}"
    return raw_path


def route(method: str, raw_path: str, raw_query: str, has_copy_source: bool) -> Route:
    """The operation of a path-style request (`/`, `/bucket`, `/bucket/key`), its bucket and key (bytes: a key is
    any byte string the client percent-encoded) and its decoded query."""
    path = raw_path.split("?", 1)[0]
    if not path.startswith("/"):
        raise S3Error("InvalidRequest", f"path {path!r} does not start with /")
    bucket_part, _, key_part = path[1:].partition("/")
    bucket = unquote_to_bytes(bucket_part).decode("utf-8", "replace")
    key = unquote_to_bytes(key_part)
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        raise S3Error("InvalidArgument", "an object key is UTF-8 text", path) from None
    scope = "object" if key else "bucket" if bucket else "service"
    query = dict(parse_qsl(raw_query, keep_blank_values=True))
    method = method.upper()
    subresources = frozenset(query) & SUBRESOURCES
    if query.get("versionId") == "null":  # the one version of an object in an unversioned bucket
        subresources -= {"versionId"}
    op = _TABLE.get((scope, method, subresources, has_copy_source and method == "PUT"))
    if op is None:
        what = ", ".join(sorted(subresources)) or "no subresource"
        code = "NotImplemented" if method in ("GET", "PUT", "HEAD", "DELETE", "POST") else "MethodNotAllowed"
        raise S3Error(code, f"{method} on a {scope} with {what} is not supported", path)
    if op is Op.LIST_OBJECTS and query.get("list-type") == "2":
        op = Op.LIST_OBJECTS_V2
    return Route(op, bucket, key, query)
