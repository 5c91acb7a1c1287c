"""The digests of one upload's body, computed as it streams: MD5 always (it is the ETag), and only what the client
asked to be checked besides: its declared x-amz-content-sha256, Content-MD5, and one x-amz-checksum-<algorithm>
sent as a header or, announced by x-amz-trailer, as an aws-chunked trailer. Hashing is the gateway's main CPU cost
per byte, so nothing is computed that nobody will compare or echo."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import crc32c
from awscrt.checksums import crc64nvme
from isal import isal_zlib

from blobstore_server.services.s3.errors import S3Error

PREFIX = "x-amz-checksum-"
# S3 gives a multipart object's CRC64NVME only as FULL_OBJECT (the CRC of the whole), which needs the parts' sizes
# and a combine step; the gateway checks and keeps each part's and gives the object none yet
NOT_COMPOSED = ("crc64nvme",)
Buffer = bytes | bytearray | memoryview


class _Digest(Protocol):
    def update(self, data: Buffer, /) -> None: ...

    def digest(self) -> bytes: ...


class _Crc:
    """A CRC as a hashlib-like object: the big-endian value, `size` bytes, is what S3 base64-encodes."""

    def __init__(self, step: Callable[[Buffer, int], int], size: int) -> None:
        self._step, self._value, self._size = step, 0, size

    def update(self, data: Buffer, /) -> None:
        self._value = self._step(data, self._value)

    def digest(self) -> bytes:
        return (self._value & ((1 << 8 * self._size) - 1)).to_bytes(self._size, "big")


# algorithm -> (a fresh digest, its size in bytes); CRC64NVME from awscrt, AWS's own (8 GB/s here)
ALGORITHMS: dict[str, tuple[Callable[[], _Digest], int]] = {
    "crc32": (lambda: _Crc(isal_zlib.crc32, 4), 4),
    "crc32c": (lambda: _Crc(crc32c.crc32c, 4), 4),
    "crc64nvme": (lambda: _Crc(crc64nvme, 8), 8),
    "sha1": (hashlib.sha1, 20),
    "sha256": (hashlib.sha256, 32),
}


@dataclass(frozen=True)
class Digests:
    """What a verified upload yields: the MD5 hex (the ETag, unquoted) and the checksum headers to echo."""

    md5_hex: str
    checksums: dict[str, str]  # e.g. {"x-amz-checksum-crc32": "<base64>"}


def algorithm_named(name: str) -> str:
    """The algorithm an x-amz-checksum-* header or trailer (or x-amz-sdk-checksum-algorithm, or a multipart
    upload's x-amz-checksum-algorithm) names (400 for one S3 does not know)."""
    algorithm = name.strip().lower().removeprefix(PREFIX)
    if algorithm not in ALGORITHMS:
        raise S3Error("InvalidRequest", f"Unknown checksum algorithm {name!r}")
    return algorithm


def _decoded(value: str, size: int) -> bytes | None:
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size else None


def composite(parts: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The checksum of a multipart object whose every part carried one checksum of the same algorithm (`parts`:
    each part's, as UploadDigests echoed them): that algorithm over the parts' binary checksums, base64, then `-N`
    (S3's ChecksumType COMPOSITE). Empty when a part carried none, or another, or one S3 does not compose."""
    names = {tuple(name.lower() for name in checksums) for checksums in parts}
    if len(names) != 1 or len(name := next(iter(names))) != 1 or name[0].removeprefix(PREFIX) not in ALGORITHMS:
        return {}
    if name[0].removeprefix(PREFIX) in NOT_COMPOSED:
        return {}
    factory, size = ALGORITHMS[name[0].removeprefix(PREFIX)]
    digest = factory()
    for checksums in parts:
        raw = _decoded(next(iter(checksums.values())), size)
        if raw is None:
            return {}
        digest.update(raw)
    return {name[0]: f"{base64.b64encode(digest.digest()).decode()}-{len(parts)}"}


class UploadDigests:
    """Feed the decoded body to `update`, then `check` it against everything declared (S3Error on a mismatch)."""

    def __init__(self, content_sha256: str | None = None, content_md5: str | None = None,
                 checksum_headers: Mapping[str, str] | None = None, trailer_names: Iterable[str] = (),
                 sdk_algorithm: str | None = None) -> None:
        self._md5 = hashlib.md5(usedforsecurity=False)
        self._content_md5 = None if content_md5 is None else _decoded(content_md5, 16)
        if content_md5 is not None and self._content_md5 is None:
            raise S3Error("InvalidDigest", "The Content-MD5 you specified was invalid.")
        self._content_sha256 = content_sha256.lower() if content_sha256 else None
        self._expected: dict[str, bytes] = {}
        wanted = {algorithm_named(name) for name in trailer_names if name.strip()}
        for name, value in (checksum_headers or {}).items():
            algorithm = algorithm_named(name)
            raw = _decoded(value, ALGORITHMS[algorithm][1])
            if raw is None:
                raise S3Error("InvalidRequest", f"Value for {PREFIX}{algorithm} header is invalid.")
            self._expected[algorithm] = raw
        wanted |= set(self._expected)
        if sdk_algorithm:
            wanted.add(algorithm_named(sdk_algorithm))
        if len(wanted) > 1:
            raise S3Error("InvalidRequest", "Expecting a single x-amz-checksum- header. Multiple checksum Types are "
                                            "not allowed.")
        self._digests: dict[str, _Digest] = {name: ALGORITHMS[name][0]() for name in wanted}
        if self._content_sha256 and "sha256" not in self._digests:
            self._digests["sha256"] = hashlib.sha256()
        self._echo = wanted

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], content_sha256: str | None) -> UploadDigests:
        """From a request's headers (lowercase names); `content_sha256` is the declared hex digest, if any."""
        checksums = {name: value for name, value in headers.items()
                     if name.startswith(PREFIX) and name.removeprefix(PREFIX) in ALGORITHMS}
        trailer = headers.get("x-amz-trailer", "")
        return cls(content_sha256, headers.get("content-md5"), checksums,
                   [name for name in trailer.split(",") if name.strip().lower().startswith(PREFIX)],
                   headers.get("x-amz-sdk-checksum-algorithm"))

    @property
    def declared(self) -> bool:
        """Whether the client declared a digest of the body to check (Content-MD5, or a checksum)."""
        return self._content_md5 is not None or bool(self._echo)

    def update(self, data: Buffer) -> None:
        self._md5.update(data)
        for digest in self._digests.values():
            digest.update(data)

    def check(self, trailers: Mapping[str, str] | None = None) -> Digests:
        """The digests, once each one declared (in a header or in `trailers`) matched what was read."""
        if self._content_sha256 and self._digests["sha256"].digest().hex() != self._content_sha256:
            raise S3Error("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match "
                                                       "what was computed.")
        md5 = self._md5.digest()
        if self._content_md5 is not None and md5 != self._content_md5:
            raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we received.")
        expected = dict(self._expected)
        for name, value in (trailers or {}).items():
            if not name.lower().startswith(PREFIX):
                continue
            algorithm = algorithm_named(name)
            raw = _decoded(value, ALGORITHMS[algorithm][1])
            if algorithm not in self._echo or raw is None:
                raise S3Error("InvalidRequest", f"The trailer {name} was not declared in x-amz-trailer or is invalid")
            expected[algorithm] = raw
        computed = {name: self._digests[name].digest() for name in self._echo}
        for algorithm, raw in expected.items():
            if computed[algorithm] != raw:
                raise S3Error("BadDigest", f"The {algorithm.upper()} you specified did not match the calculated "
                                           "checksum.")
        return Digests(md5.hex(), {PREFIX + name: base64.b64encode(value).decode() for name, value in computed.items()})
