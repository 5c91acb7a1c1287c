"""Upload tokens of a multipart upload: one per blob, the capability to write exactly that blob.

`POST /blob/alloc` hands out a Location and one token per blob; `PUT /blob/putat?token=T` writes the
blob the token names, and only with `size` bytes, until `expiry`. The body starts with its own kind
byte, distinct from a Location's version byte, so a Location token is never accepted as an upload
token (both are signed with the cluster secret).
"""

from __future__ import annotations

from dataclasses import dataclass

from blobstore_server.libs.proto.location import MAX_BLOB_SIZE
from blobstore_server.libs.proto.tokens import MAX_VARINT, Reader, max_token_len, put_varint, sign, verified_body
from blobstore_server.libs.proto.widths import U32_MAX, U64_MAX
from blobstore_server.libs.rpc.errors import BadRequest, Forbidden

KIND = 0x81
_WHAT = "upload token"
MAX_TOKEN_LEN = max_token_len(1 + 5 + 5 + MAX_VARINT + 4 + 5)


@dataclass(frozen=True)
class BlobToken:
    cluster_id: int
    vid: int
    bid: int
    size: int  # the blob's exact length
    expiry: int  # unix seconds after which the token is refused

    def __post_init__(self) -> None:
        for name, value, high in (("cluster_id", self.cluster_id, U32_MAX), ("vid", self.vid, U32_MAX),
                                  ("bid", self.bid, U64_MAX), ("size", self.size, MAX_BLOB_SIZE),
                                  ("expiry", self.expiry, U32_MAX)):
            if type(value) is not int or not 0 <= value <= high:
                raise ValueError(f"{name} {value!r} outside 0..{high}")

    def to_token(self, secret: bytes) -> str:
        out = bytearray([KIND])
        for value in (self.cluster_id, self.vid, self.bid, self.size, self.expiry):
            put_varint(out, value)
        return sign(secret, bytes(out))

    @classmethod
    def from_token(cls, token: str, secret: bytes, now: float) -> BlobToken:
        """Verify and decode: BadRequest if malformed, Forbidden if forged or expired."""
        body = verified_body(token, secret, _WHAT, MAX_TOKEN_LEN)
        if body[0] != KIND:
            raise BadRequest(f"{_WHAT} kind {body[0]} is not {KIND}: not an upload token")
        r = Reader(body, 1, _WHAT)
        fields = [r.varint() for _ in range(5)]
        r.end()
        try:
            parsed = cls(*fields)
        except ValueError as exc:
            raise BadRequest(f"{_WHAT} field out of range: {exc}") from None
        if parsed.expiry < now:
            raise Forbidden(f"{_WHAT} expired {now - parsed.expiry:.0f} s ago")
        return parsed
