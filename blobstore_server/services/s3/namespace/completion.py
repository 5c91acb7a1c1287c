"""CompleteMultipartUpload's rules, with no I/O: which parts, in what order, how big, and the object they make.

The object's manifest is the listed parts' manifests one after the other, offsets shifted (no byte is copied); its
ETag is the MD5 of the parts' binary MD5s, then `-N`; its checksum, when every part carried one of the same
algorithm, is S3's composite one (checksums.composite).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from blobstore_server.services.s3.checksums import composite
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace.records import Extent, Manifest, Part, bare_etag

MIN_PART_SIZE = 5 * 1024 * 1024  # every part but the last
MAX_PART_NUMBER = 10_000


@dataclass(frozen=True)
class Completed:
    size: int
    etag: str
    manifest: Manifest
    unlisted: list[Part]  # uploaded but not listed: their blobs go to GC
    checksums: dict[str, str]  # e.g. {"x-amz-checksum-crc32": "<base64>-3"}, or none


def multipart_etag(part_etags: Sequence[str]) -> str:
    digest = hashlib.md5(b"".join(bytes.fromhex(bare_etag(etag)) for etag in part_etags), usedforsecurity=False)
    return f"{digest.hexdigest()}-{len(part_etags)}"


def check_part_number(number: int) -> None:
    if not 1 <= number <= MAX_PART_NUMBER:
        raise S3Error("InvalidArgument", f"part numbers are 1 to {MAX_PART_NUMBER}")


def complete(listed: Sequence[tuple[int, str]], uploaded: Mapping[int, Part]) -> Completed:
    """The object `listed` (part number, ETag quoted or not) makes of the `uploaded` parts, or S3's error."""
    if not listed:
        raise S3Error("MalformedXML", "a CompleteMultipartUpload lists at least one part")
    numbers = [number for number, _ in listed]
    if any(a >= b for a, b in pairwise(numbers)):
        raise S3Error("InvalidPartOrder", "parts are listed in ascending order of part number, each once")
    parts: list[Part] = []
    for number, etag in listed:
        part = uploaded.get(number)
        if part is None or part.etag != bare_etag(etag):
            raise S3Error("InvalidPart", f"part {number} was not uploaded, or its ETag differs")
        parts.append(part)
    if any(part.size < MIN_PART_SIZE for part in parts[:-1]):
        raise S3Error("EntityTooSmall", f"every part but the last is at least {MIN_PART_SIZE} bytes")
    manifest: list[Extent] = []
    offset = 0
    for ordinal, part in enumerate(parts, 1):
        manifest.extend(Extent(offset + e.offset, e.size, e.location, ordinal) for e in part.manifest)
        offset += part.size
    chosen = set(numbers)
    return Completed(offset, multipart_etag([part.etag for part in parts]), tuple(manifest),
                     [part for number, part in sorted(uploaded.items()) if number not in chosen],
                     composite([part.checksums for part in parts]))
