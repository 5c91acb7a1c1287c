"""The Location of a stored object (DESIGN section 3) and its signed, compact token.

A Location is all access needs to read or delete an object, so it is handed to the client and must
not be forgeable: the token is `body || HMAC-SHA256(secret, body)[:16]`, base64url without padding.
The body is a version byte, then unsigned LEB128 varints (CRC as 4 fixed bytes: it is random, so a
varint would cost 5). The MAC is checked before the body is parsed, so a forged body is never parsed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from libs.ec import CodeMode
from libs.rpc.errors import BadRequest, Forbidden

VERSION = 1
MAC_SIZE = 16
MAX_SLICES = 4  # seeds/004 MaxLocationBlobs
MAX_OBJECT_SIZE = 5 << 30
MAX_BLOB_SIZE = 1 << 25  # seeds/004 MaxBlobSize; the codec's limit too
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
_MAX_VARINT = 10  # bytes of a u64 in LEB128
# Longest possible body: version, 5 header varints and the CRC, slice count, 4 slices of 3 varints.
_MAX_BODY = 1 + 5 + 1 + 10 + 5 + 4 + 1 + MAX_SLICES * (10 + 5 + 5)
MAX_TOKEN_LEN = -(-(_MAX_BODY + MAC_SIZE) * 4 // 3)
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_CRC = struct.Struct(">I")
_MODES = frozenset(int(m) for m in CodeMode)


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
        _check("vid", self.vid, 0, U32)
        _check("count", self.count, 1, U32)
        _check("min_bid", self.min_bid, 0, U64 - self.count + 1)  # the last bid must fit in u64 too


@dataclass(frozen=True)
class Location:
    """Where an object's blobs live; every blob is `blob_size` bytes but the last, which holds the rest."""

    cluster_id: int
    code_mode: int
    size: int
    blob_size: int
    crc: int
    blobs: tuple[SliceInfo, ...]

    def __post_init__(self) -> None:
        _check("cluster_id", self.cluster_id, 0, U32)
        if isinstance(self.code_mode, bool) or self.code_mode not in _MODES:
            raise ValueError(f"unknown code mode {self.code_mode!r}")
        object.__setattr__(self, "code_mode", int(self.code_mode))  # a CodeMode given reads back as a plain int
        _check("size", self.size, 0, MAX_OBJECT_SIZE)
        _check("blob_size", self.blob_size, 1, MAX_BLOB_SIZE)
        _check("crc", self.crc, 0, U32)
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

    def to_token(self, secret: bytes) -> str:
        """The signed token handed to clients (base64url, no padding)."""
        body = self._body()
        raw = body + _mac(secret, body)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    @classmethod
    def from_token(cls, token: str, secret: bytes) -> Location:
        """Verify and decode a token: BadRequest if malformed, Forbidden if not signed with `secret`."""
        raw = _unbase64(token)
        if len(raw) < 1 + MAC_SIZE:
            raise BadRequest(f"location token too short: {len(raw)} bytes")
        body, mac = raw[:-MAC_SIZE], raw[-MAC_SIZE:]
        if not hmac.compare_digest(mac, _mac(secret, body)):
            raise Forbidden("location token signature does not match: altered, forged or from another cluster")
        return cls._parse(body)

    def _body(self) -> bytes:
        out = bytearray([VERSION])
        for value in (self.cluster_id, self.code_mode, self.size, self.blob_size):
            _put_varint(out, value)
        out += _CRC.pack(self.crc)
        out.append(len(self.blobs))
        for s in self.blobs:
            for value in (s.min_bid, s.vid, s.count):
                _put_varint(out, value)
        return bytes(out)

    @classmethod
    def _parse(cls, body: bytes) -> Location:
        if body[0] != VERSION:
            raise BadRequest(f"location token version {body[0]} is not {VERSION}")
        r = _Reader(body, 1)
        cluster_id, code_mode, size, blob_size = r.varint(), r.varint(), r.varint(), r.varint()
        crc = _CRC.unpack(r.take(_CRC.size))[0]
        n = r.take(1)[0]
        blobs: list[SliceInfo] = []
        try:
            for _ in range(n):
                blobs.append(SliceInfo(min_bid=r.varint(), vid=r.varint(), count=r.varint()))
            if r.pos != len(body):
                raise BadRequest(f"location token has {len(body) - r.pos} trailing bytes")
            return cls(cluster_id, code_mode, size, blob_size, crc, tuple(blobs))
        except ValueError as e:
            raise BadRequest(f"location token field out of range: {e}") from None


def _mac(secret: bytes, body: bytes) -> bytes:
    if not secret:
        raise ValueError("the cluster secret must not be empty")
    return hmac.new(secret, body, hashlib.sha256).digest()[:MAC_SIZE]


def _unbase64(token: str) -> bytes:
    if not isinstance(token, str):
        raise BadRequest(f"location token must be a string, not {type(token).__name__}")
    if len(token) > MAX_TOKEN_LEN:
        raise BadRequest(f"location token too long: {len(token)} characters, at most {MAX_TOKEN_LEN}")
    if not _B64URL.fullmatch(token) or len(token) % 4 == 1:
        raise BadRequest("location token is not base64url (A-Z a-z 0-9 - _, no padding)")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except binascii.Error:
        raise BadRequest("location token is not base64url") from None
    # Unused low bits in the last character would let two strings name one token; allow one spelling.
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != token:
        raise BadRequest("location token is not canonical base64url")
    return raw


def _put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


class _Reader:
    """Cursor over a body; running off the end or an overlong varint is a BadRequest."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise BadRequest("location token ends early")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def varint(self) -> int:
        value = 0
        for shift in range(0, 7 * _MAX_VARINT, 7):
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise BadRequest("location token has an overlong varint")
                return value
        raise BadRequest("location token has a varint longer than 10 bytes")
