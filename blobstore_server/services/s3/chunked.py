"""An incremental decoder of `Content-Encoding: aws-chunked` bodies, fed the body in whatever slices arrive.

Bodies run to 5 GiB, so nothing is held but one chunk-size line (at most MAX_LINE bytes) and the trailers: the
payload comes back as views of the slices fed in, and each signed chunk is hashed as it passes. A chunk's bytes are
returned before its signature (which follows them) can be checked, so nothing read is authentic until `finish()`
returns: the caller may stream it on, but must not commit it before then. Frames (AWS docs, sigv4-streaming and
sigv4-streaming-trailers):

    signed:           hex;chunk-signature=SIG CRLF data CRLF ... 0;chunk-signature=SIG CRLF CRLF
    signed-trailer:   ... 0;chunk-signature=SIG CRLF name:value CRLF ... x-amz-trailer-signature:SIG CRLF CRLF
    unsigned-trailer: hex CRLF data CRLF ... 0 CRLF name:value CRLF ... CRLF
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection
from enum import Enum

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.sigv4 import EMPTY_SHA256, ChunkSigning, PayloadMode

MAX_LINE = 4096  # a chunk-size or trailer line longer than this is refused
MAX_CHUNK = 16 * 1024 * 1024
MAX_TRAILERS = 16
_SIGNATURE_FIELD = b"chunk-signature="
_TRAILER_SIGNATURE = "x-amz-trailer-signature"
Buffer = bytes | bytearray | memoryview


class _State(Enum):
    SIZE = "size"  # reading a chunk-size line
    DATA = "data"  # inside a chunk's data
    DATA_END = "data-end"  # expecting the CRLF after a chunk's data
    TRAILER = "trailer"  # after the zero chunk: trailer lines up to an empty line
    DONE = "done"


def _framing(message: str) -> S3Error:
    return S3Error("InvalidRequest", f"Malformed aws-chunked body: {message}")


def _mismatch(what: str) -> S3Error:
    return S3Error("SignatureDoesNotMatch", f"The {what} signature we calculated does not match the one you provided")


class ChunkedDecoder:
    """Feed the body slice by slice (`feed`), then `finish()`: the trailers, once the body proved whole and signed."""

    def __init__(self, mode: PayloadMode, signing: ChunkSigning | None = None, decoded_length: int | None = None,
                 declared_trailers: Collection[str] | None = None) -> None:
        if not mode.streaming:
            raise ValueError(f"{mode} is not an aws-chunked payload")
        if mode.chunks_signed and signing is None:
            raise ValueError("signed chunks need the request's signing material")
        self.mode, self._signing = mode, signing
        self._expected_length = decoded_length
        self._declared = None if declared_trailers is None else {name.strip().lower() for name in declared_trailers}
        self._previous = signing.seed_signature if signing else ""
        self._prefix = f"AWS4-HMAC-SHA256-PAYLOAD\n{signing.amz_date}\n{signing.scope}\n" if signing else ""
        self._state = _State.SIZE
        self._line = bytearray()
        self._remaining = 0
        self._chunk_signature = ""
        self._hash: hashlib._Hash | None = None
        self._trailers: dict[str, str] = {}
        self._trailer_signature: str | None = None
        self._error: S3Error | None = None
        self.decoded = 0  # payload bytes returned so far

    def feed(self, data: Buffer) -> list[memoryview]:
        """The payload bytes in `data` (views of it, in order); S3Error as soon as the body is known to be bad."""
        if self._error is not None:
            raise self._error
        try:
            return self._feed(data)
        except S3Error as error:
            self._error = error
            raise

    def _feed(self, data: Buffer) -> list[memoryview]:
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        found: list[memoryview] = []
        position, end = 0, len(view)
        while position < end:
            if self._state is _State.DATA:
                taken = min(self._remaining, end - position)
                piece = view[position:position + taken]
                if self._hash is not None:
                    self._hash.update(piece)
                found.append(piece)
                position += taken
                self._remaining -= taken
                self._count(taken)
                if not self._remaining:
                    self._end_of_data()
            elif self._state is _State.DONE:
                raise _framing("bytes after the end of the body")
            else:
                position, line = self._take_line(data, view, position)
                if line is not None:
                    self._on_line(line)
        return found

    def _take_line(self, data: Buffer, view: memoryview, position: int) -> tuple[int, bytes | None]:
        """Where reading goes on and the line ending there (CRLF or LF stripped), None while it is incomplete."""
        limit = min(len(view), position + MAX_LINE + 2 - len(self._line))
        if isinstance(data, bytes):
            newline = data.find(b"\n", position, limit)
        else:
            newline = bytes(view[position:limit]).find(b"\n")
            newline = newline + position if newline >= 0 else -1
        if newline < 0:
            self._line += view[position:limit]
            if len(self._line) > MAX_LINE + 1:  # + 1: the CR of a line still to end
                raise _framing(f"a line longer than {MAX_LINE} bytes")
            return limit, None
        line = bytes(self._line) + bytes(view[position:newline]) if self._line else bytes(view[position:newline])
        self._line.clear()
        return newline + 1, line[:-1] if line.endswith(b"\r") else line

    def _on_line(self, line: bytes) -> None:
        if self._state is _State.SIZE:
            self._on_size(line)
        elif self._state is _State.DATA_END:
            if line:
                raise _framing("a chunk's data is longer than its size says")
            self._state = _State.SIZE
        else:
            self._on_trailer(line)

    def _on_size(self, line: bytes) -> None:
        size_text, _, extension = line.partition(b";")
        if not size_text or len(size_text) > 8 or size_text.strip(b"0123456789abcdefABCDEF"):
            raise _framing(f"the chunk size {size_text[:16]!r} is not hex")
        size = int(size_text, 16)
        if size > MAX_CHUNK:
            raise _framing(f"a chunk of {size} bytes is over the {MAX_CHUNK} byte limit")
        if self.mode.chunks_signed:
            signature = extension[len(_SIGNATURE_FIELD):] if extension.startswith(_SIGNATURE_FIELD) else b""
            if len(signature) != 64:
                raise _framing("a signed chunk without chunk-signature=<64 hex>")
            self._chunk_signature = signature.decode("ascii", "replace")
            self._hash = hashlib.sha256()
        if size:
            self._state, self._remaining = _State.DATA, size
            return
        self._end_of_data()
        self._state = _State.TRAILER

    def _end_of_data(self) -> None:
        """A chunk's data is all in: check its signature, chained on the previous one."""
        self._state = _State.DATA_END
        if self._hash is None or self._signing is None:
            return
        string_to_sign = f"{self._prefix}{self._previous}\n{EMPTY_SHA256}\n{self._hash.hexdigest()}"
        expected = hmac.new(self._signing.key, string_to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, self._chunk_signature):
            raise _mismatch("chunk")
        self._previous, self._hash = expected, None

    def _on_trailer(self, line: bytes) -> None:
        if not line:
            if self.mode is PayloadMode.STREAMING_SIGNED_TRAILER and self._trailers and not self._trailer_signature:
                return  # some SDKs end the checksum line with LF and put a CRLF before the signature line
            self._end_of_trailers()
            return
        if self.mode is PayloadMode.STREAMING_SIGNED:
            raise _framing("trailers after the last chunk, but x-amz-content-sha256 promised none")
        name, colon, value = line.decode("utf-8", "replace").partition(":")
        name = name.strip().lower()
        if not colon or not name:
            raise _framing(f"the trailer line {line[:64]!r} is not name:value")
        if name == _TRAILER_SIGNATURE:
            self._trailer_signature = value.strip()
        elif len(self._trailers) >= MAX_TRAILERS or name in self._trailers:
            raise _framing(f"too many or repeated trailers ({name})")
        else:
            self._trailers[name] = value.strip()

    def _end_of_trailers(self) -> None:
        self._state = _State.DONE
        if self.mode is not PayloadMode.STREAMING_SIGNED_TRAILER or self._signing is None:
            if self._trailer_signature is not None:
                raise _framing("a trailer signature on a body whose trailers are not signed")
            return
        if self._trailer_signature is None:
            raise _mismatch("trailer (missing)")
        canonical = "".join(f"{name}:{value}\n" for name, value in self._trailers.items())
        string_to_sign = (f"AWS4-HMAC-SHA256-TRAILER\n{self._signing.amz_date}\n{self._signing.scope}\n"
                          f"{self._previous}\n{hashlib.sha256(canonical.encode()).hexdigest()}")
        expected = hmac.new(self._signing.key, string_to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, self._trailer_signature):
            raise _mismatch("trailer")

    def _count(self, taken: int) -> None:
        self.decoded += taken
        if self._expected_length is not None and self.decoded > self._expected_length:
            raise S3Error("IncompleteBody", f"The body holds more than the {self._expected_length} bytes "
                                            "x-amz-decoded-content-length declares")

    def finish(self) -> dict[str, str]:
        """The trailers (lowercase names, x-amz-trailer-signature left out), once the body ended as it must."""
        if self._error is not None:
            raise self._error
        if self._state is _State.TRAILER and self.mode is PayloadMode.STREAMING_UNSIGNED_TRAILER \
                and not self._trailers and not self._line:
            self._state = _State.DONE  # `0\r\n` and the end: what the AWS SDK for JavaScript sends with no checksum
        if self._state is not _State.DONE:
            raise S3Error("IncompleteBody", "The body ended before its last chunk and trailers")
        if self._expected_length is not None and self.decoded != self._expected_length:
            raise S3Error("IncompleteBody", f"You did not provide the {self._expected_length} bytes "
                                            "x-amz-decoded-content-length declares")
        if self._declared is not None and set(self._trailers) != self._declared:
            raise S3Error("InvalidRequest", f"The trailers sent ({', '.join(sorted(self._trailers)) or 'none'}) are "
                                            f"not those x-amz-trailer declares ({', '.join(sorted(self._declared))})")
        return dict(self._trailers)
