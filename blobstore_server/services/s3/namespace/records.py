"""The namespace's records: what the store takes and hands back, one type per concept.

Keys are bytes (S3 orders them bytewise); ETags are stored and returned bare (hex, or hex-N for multipart), the HTTP
layer quotes them. Times are milliseconds since the epoch. Location tokens are the access service's, opaque here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Extent:
    """`size` bytes of an object from `offset` on, held by the blob at `location`; in a multipart object, from its
    `part`-th part (1-based, in the completed order: what GET ?partNumber= reads), else part 0."""

    offset: int
    size: int
    location: str
    part: int = 0


Manifest = tuple[Extent, ...]


@dataclass(frozen=True)
class ObjectMeta:
    """What a PUT or a multipart Create sets and a GET answers with: the standard headers and x-amz-meta-*."""

    content_type: str = "binary/octet-stream"
    cache_control: str | None = None
    content_disposition: str | None = None
    content_encoding: str | None = None
    content_language: str | None = None
    expires: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # x-amz-meta-<name> -> value, names lower-case


@dataclass(frozen=True)
class ObjectRecord:
    """An object: its bytes are `manifest`'s extents, in order; `checksums` (algorithm -> base64) are echoed."""

    key: bytes
    size: int
    etag: str
    last_modified_ms: int
    meta: ObjectMeta = field(default_factory=ObjectMeta)
    checksums: dict[str, str] = field(default_factory=dict)
    parts_count: int | None = None  # multipart objects: how many parts
    manifest: Manifest = ()


@dataclass(frozen=True)
class ListedObject:
    """An object as a listing shows it."""

    key: bytes
    size: int
    etag: str
    last_modified_ms: int


@dataclass(frozen=True)
class Bucket:
    id: str
    name: str
    owner: str
    created_ms: int


@dataclass(frozen=True)
class User:
    """A user of the gateway (its secret only in its Credentials)."""

    name: str
    access_key: str
    created_ms: int


@dataclass(frozen=True)
class Credentials:
    """A user and the secret it signs with."""

    user: User
    secret: str


@dataclass
class Intent:
    """A PUT (or part upload) in flight, as its gateway holds it: the blobs it wrote are recorded under it until it
    commits or is given up. Its row is written with its first recorded blob (`opened`); `pending` are blobs stored
    but not recorded yet (a body's short last segment: the commit records it in its own transaction, so a small
    object costs one write)."""

    bucket_id: str
    id: str
    key: bytes
    opened: bool = False
    pending: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Upload:
    """A multipart upload in progress. Upload ids sort by initiation time."""

    id: str
    key: bytes
    initiated_ms: int
    owner: str
    meta: ObjectMeta = field(default_factory=ObjectMeta)


@dataclass(frozen=True)
class Part:
    """An uploaded part; its manifest's offsets start at 0 within the part."""

    number: int
    size: int
    etag: str
    last_modified_ms: int
    checksums: dict[str, str] = field(default_factory=dict)
    manifest: Manifest = ()


@dataclass(frozen=True)
class IfNoneMatch:
    """`If-None-Match: *`: write only when the key holds no object."""


@dataclass(frozen=True)
class IfMatch:
    """`If-Match: etag` (quoted or not): write only over the object with this ETag."""

    etag: str


Condition = IfNoneMatch | IfMatch | None


@dataclass(frozen=True)
class Garbage:
    """A blob no object refers to any more, due for deletion through access."""

    bucket_id: str
    id: str
    location: str


@dataclass(frozen=True)
class ObjectsPage:
    """A page of ListObjects: `next_marker` is the last key or prefix given (its base64 is the continuation token)."""

    objects: list[ListedObject]
    prefixes: list[bytes]
    truncated: bool
    next_marker: bytes | None


@dataclass(frozen=True)
class UploadsPage:
    """A page of ListMultipartUploads (`next_upload_id_marker` is None when the page ended on a common prefix)."""

    uploads: list[Upload]
    prefixes: list[bytes]
    truncated: bool
    next_key_marker: bytes | None
    next_upload_id_marker: str | None


@dataclass(frozen=True)
class PartsPage:
    upload: Upload
    parts: list[Part]
    truncated: bool
    next_part_number_marker: int | None


def bare_etag(etag: str) -> str:
    """An ETag as stored: clients send them quoted or not (s3-tests strips the quotes)."""
    etag = etag.strip()
    return etag[1:-1] if len(etag) >= 2 and etag[0] == etag[-1] == '"' else etag
