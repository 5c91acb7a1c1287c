"""The Location of a stored object (docs/architecture.md) and its signed, compact token.

A Location is all access needs to read or delete an object, so it is handed to the client and must
not be forgeable: it travels as a signed token (`libs/proto/tokens.py`). The body is a version byte,
then unsigned LEB128 varints (CRC as 4 fixed bytes: it is random, so a varint would cost 5).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from blobstore.records import MAX_OBJECT_SIZE, Slice, Stat
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.tokens import MAX_VARINT, Reader, max_token_len, put_varint, sign, verified_body
from blobstore_server.libs.proto.widths import U32_MAX, U64_MAX
from blobstore_server.libs.rpc.errors import BadRequest

VERSION = 1
MAX_SLICES = 4  # CubeFS BlobStore: MaxLocationBlobs
MAX_BLOB_SIZE = 1 << 25  # CubeFS BlobStore: MaxBlobSize; the codec's limit too
# Longest possible body: version, 5 header varints and the CRC, slice count, 4 slices of 3 varints.
_MAX_BODY = 1 + 5 + 1 + MAX_VARINT + 5 + 4 + 1 + MAX_SLICES * (MAX_VARINT + 5 + 5)
MAX_TOKEN_LEN = max_token_len(_MAX_BODY)
_WHAT = "location token"
_CRC = struct.Struct(">I")


def _code_mode(number: int) -> CodeMode:
    try:
        return CodeMode(number)
    except ValueError:
        raise ValueError(f"unknown code mode {number!r}") from None


def _check(name: str, value: int, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{name} {value!r} outside {low}..{high}")


@dataclass(frozen=True)
class SliceInfo:
    """`count` consecutive bids from `min_bid`, all in volume `vid`."""

    min_bid: int
    vid: int
    count: int

    def __post_init__(self) -> None:
        _check("vid", self.vid, 0, U32_MAX)
        _check("count", self.count, 1, U32_MAX)
        _check("min_bid", self.min_bid, 0, U64_MAX - self.count + 1)  # the last bid must fit in u64 too


@dataclass(frozen=True)
class Location:
    """Where an object's blobs live; every blob is `blob_size` bytes but the last, which holds the rest. Its code
    mode is its volumes' (the token carries the mode's number)."""

    cluster_id: int
    code_mode: CodeMode
    size: int
    blob_size: int
    crc: int
    blobs: tuple[SliceInfo, ...]

    def __post_init__(self) -> None:
        _check("cluster_id", self.cluster_id, 0, U32_MAX)
        if type(self.code_mode) is not CodeMode:
            raise ValueError(f"code mode {self.code_mode!r} is not a CodeMode")
        _check("size", self.size, 0, MAX_OBJECT_SIZE)
        _check("blob_size", self.blob_size, 1, MAX_BLOB_SIZE)
        _check("crc", self.crc, 0, U32_MAX)
        if not isinstance(self.blobs, tuple) or not all(isinstance(s, SliceInfo) for s in self.blobs):
            raise ValueError("blobs must be a tuple of SliceInfo")
        if len(self.blobs) > MAX_SLICES:
            raise ValueError(f"{len(self.blobs)} slices; at most {MAX_SLICES}")
        needed = -(-self.size // self.blob_size)
        if self.blob_count != needed:
            raise ValueError(f"slices hold {self.blob_count} blobs; {self.size} bytes / {self.blob_size} need {needed}")

    @property
    def blob_count(self) -> int:
        return sum(s.count for s in self.blobs)

    def blob_ids(self) -> Iterator[tuple[int, int]]:
        """(vid, bid) of every blob, in object order."""
        for s in self.blobs:
            for bid in range(s.min_bid, s.min_bid + s.count):
                yield s.vid, bid

    def blob_len(self, index: int) -> int:
        """Bytes held by blob `index`: `blob_size`, except the last holds the remainder."""
        if not 0 <= index < self.blob_count:
            raise IndexError(f"blob {index} outside 0..{self.blob_count - 1}")
        return min(self.blob_size, self.size - index * self.blob_size)

    def stat(self) -> Stat:
        """What the SDK's `stat` answers: everything the location says, no blobnode read."""
        return Stat(size=self.size, crc=self.crc, code_mode=self.code_mode.name, blob_size=self.blob_size,
                    cluster_id=self.cluster_id, blobs=tuple(Slice(vid=s.vid, min_bid=s.min_bid, count=s.count)
                                                            for s in self.blobs))

    def to_token(self, secret: bytes) -> str:
        """The signed token handed to clients (base64url, no padding)."""
        return sign(secret, self._body())

    @classmethod
    def from_token(cls, token: str, secret: bytes) -> Location:
        """Verify and decode a token: BadRequest if malformed, Forbidden if not signed with `secret`."""
        return cls._parse(verified_body(token, secret, _WHAT, MAX_TOKEN_LEN))

    def _body(self) -> bytes:
        out = bytearray([VERSION])
        for value in (self.cluster_id, self.code_mode, self.size, self.blob_size):
            put_varint(out, value)
        out += _CRC.pack(self.crc)
        out.append(len(self.blobs))
        for s in self.blobs:
            for value in (s.min_bid, s.vid, s.count):
                put_varint(out, value)
        return bytes(out)

    @classmethod
    def _parse(cls, body: bytes) -> Location:
        if body[0] != VERSION:
            raise BadRequest(f"location token version {body[0]} is not {VERSION}")
        r = Reader(body, 1, _WHAT)
        cluster_id, code_mode, size, blob_size = r.varint(), r.varint(), r.varint(), r.varint()
        crc = _CRC.unpack(r.take(_CRC.size))[0]
        n = r.take(1)[0]
        blobs: list[SliceInfo] = []
        try:
            for _ in range(n):
                blobs.append(SliceInfo(min_bid=r.varint(), vid=r.varint(), count=r.varint()))
            r.end()
            return cls(cluster_id, _code_mode(code_mode), size, blob_size, crc, tuple(blobs))
        except ValueError as e:
            raise BadRequest(f"location token field out of range: {e}") from None
