"""One S3 request as the operations see it, and their answer: what app.py reads off and writes to the wire."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from blobstore_server.services.s3.checksums import UploadDigests
from blobstore_server.services.s3.chunked import ChunkedDecoder
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace import Bucket, User
from blobstore_server.services.s3.routing import Route
from blobstore_server.services.s3.sigv4 import Verified

Body = AsyncIterator[bytes | memoryview]


@dataclass
class S3Request:
    route: Route
    headers: dict[str, str]  # lower-case names, repeats joined with ","
    body: AsyncIterator[bytes]  # as received (still aws-chunked when the client framed it so)
    auth: Verified
    user: User
    request_id: str
    bucket: Bucket | None = None  # the route's bucket, once looked up and found to be the caller's

    @property
    def owned_bucket(self) -> Bucket:
        if self.bucket is None:
            raise S3Error("InternalError", f"{self.route.op.value} ran without its bucket")
        return self.bucket

    def declared_length(self) -> int | None:
        """The payload's length as the client declared it: the decoded length of an aws-chunked body, else
        Content-Length; None for a plain chunked body. A body framed neither way (no Content-Length, no
        Transfer-Encoding) is MissingContentLength (411), as S3 answers."""
        raw = self.headers.get("x-amz-decoded-content-length") if self.auth.payload.streaming else \
            self.headers.get("content-length")
        if raw is None:
            if "content-length" not in self.headers and "transfer-encoding" not in self.headers:
                raise S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.",
                              self.route.resource)
            return None
        if not raw.isdigit():
            raise S3Error("InvalidArgument", f"the length {raw!r} is not a number")
        return int(raw)

    def decoder(self) -> ChunkedDecoder | None:
        """The aws-chunked decoder of this body, or None for a plain one."""
        if not self.auth.payload.streaming:
            return None
        trailer = self.headers.get("x-amz-trailer")
        return ChunkedDecoder(self.auth.payload, self.auth.signing, self.declared_length(),
                              [t.strip().lower() for t in trailer.split(",")] if trailer else None)

    async def payload(self, decoder: ChunkedDecoder | None) -> Body:
        """The body's payload bytes, decoded on the way when it is aws-chunked."""
        async for piece in self.body:
            if decoder is None:
                yield piece
            else:
                for part in decoder.feed(piece):
                    yield part

    async def read_all(self, limit: int) -> bytes:
        """A small body (an XML document) whole and checked against the digests the client sent; over `limit`
        bytes is refused."""
        decoder, digests = self.decoder(), self.digests()
        out = bytearray()
        async for piece in self.payload(decoder):
            out += piece
            if len(out) > limit:
                raise S3Error("MalformedXML", f"the request body is over {limit} bytes")
        digests.update(out)
        digests.check(decoder.finish() if decoder is not None else None)
        return bytes(out)

    def digests(self) -> UploadDigests:
        return UploadDigests.from_headers(self.headers, self.auth.content_sha256)


@dataclass
class S3Response:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | Body = b""
    length: int | None = None  # of a streamed body (or of what a HEAD would have sent)

    @staticmethod
    def xml(body: bytes, status: int = 200, headers: list[tuple[str, str]] | None = None) -> S3Response:
        return S3Response(status, [("content-type", "application/xml"), *(headers or [])], body)
