"""Signed compact tokens handed to clients: `body || HMAC-SHA256(secret, body)[:16]`, base64url without
padding, the body a version byte then unsigned LEB128 varints. Used by Locations and upload tokens.

The MAC is checked before the body is parsed, so a forged body is never parsed. Every defect is a
BadRequest naming the token's kind (`what`); a MAC that does not match is Forbidden.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re

from blobstore_server.libs.mac import hmac_sha256
from blobstore_server.libs.rpc.errors import BadRequest, Forbidden

MAC_SIZE = 16
MAX_VARINT = 10  # bytes of a u64 in LEB128
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def sign(secret: bytes, body: bytes) -> str:
    raw = body + mac(secret, body)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def verified_body(token: str, secret: bytes, what: str, max_len: int) -> bytes:
    """The body of a token signed with `secret`, MAC removed."""
    raw = _unbase64(token, what, max_len)
    if len(raw) < 1 + MAC_SIZE:
        raise BadRequest(f"{what} too short: {len(raw)} bytes")
    body, tag = raw[:-MAC_SIZE], raw[-MAC_SIZE:]
    if not hmac.compare_digest(tag, mac(secret, body)):
        raise Forbidden(f"{what} signature does not match: altered, forged or from another cluster")
    return body


def mac(secret: bytes, body: bytes) -> bytes:
    if not secret:
        raise ValueError("the cluster secret must not be empty")
    return hmac_sha256(secret, body)[:MAC_SIZE]


def max_token_len(max_body: int) -> int:
    return -(-(max_body + MAC_SIZE) * 4 // 3)


def _unbase64(token: str, what: str, max_len: int) -> bytes:
    if not isinstance(token, str):
        raise BadRequest(f"{what} must be a string, not {type(token).__name__}")
    if len(token) > max_len:
        raise BadRequest(f"{what} too long: {len(token)} characters, at most {max_len}")
    if not _B64URL.fullmatch(token) or len(token) % 4 == 1:
        raise BadRequest(f"{what} is not base64url (A-Z a-z 0-9 - _, no padding)")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except binascii.Error:
        raise BadRequest(f"{what} is not base64url") from None
    # Unused low bits in the last character would let two strings name one token; allow one spelling.
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != token:
        raise BadRequest(f"{what} is not canonical base64url")
    return raw


def put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


class Reader:
    """Cursor over a token body; running off the end or an overlong varint is a BadRequest."""

    def __init__(self, data: bytes, pos: int, what: str) -> None:
        self.data = data
        self.pos = pos
        self.what = what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise BadRequest(f"{self.what} ends early")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def varint(self) -> int:
        value = 0
        for shift in range(0, 7 * MAX_VARINT, 7):
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise BadRequest(f"{self.what} has an overlong varint")
                return value
        raise BadRequest(f"{self.what} has a varint longer than 10 bytes")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise BadRequest(f"{self.what} has {len(self.data) - self.pos} trailing bytes")
