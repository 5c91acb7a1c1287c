"""The aws-chunked decoder against the AWS documentation's published examples and botocore's own framing: bytes
come out whole whatever the slicing, and any change to a signed byte, a signature or the end of the body fails."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import re
from datetime import UTC, datetime

import pytest
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum, Sha256Checksum

from blobstore_server.services.s3.checksums import UploadDigests
from blobstore_server.services.s3.chunked import MAX_CHUNK, MAX_LINE, ChunkedDecoder
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.sigv4 import ChunkSigning, PayloadMode, WireRequest, signing_key, verify

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_DATE, DOC_SCOPE = "20130524T000000Z", "20130524/us-east-1/s3/aws4_request"
DOC_DATA = b"a" * 66560
DOC_SIGNATURES = ("ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
                  "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
                  "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9")
# "Signature Calculations for the Authorization Header: Transferring Payload in Multiple Chunks", Example: PUT Object
DOC_HEADERS = [
    ("Host", "s3.amazonaws.com"), ("x-amz-date", DOC_DATE), ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
    ("Authorization", "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                      "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
                      "x-amz-decoded-content-length;x-amz-storage-class,"
                      "Signature=4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"),
    ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"), ("Content-Encoding", "aws-chunked"),
    ("x-amz-decoded-content-length", "66560"), ("Content-Length", "66824")]
# "Signature calculations for trailing headers (chunked uploads)": its seed signature is given, not re-derived
TRAILER_SEED = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
TRAILER_SIGNATURES = ("b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
                      "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
                      "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992")
TRAILER_LINES = (b"x-amz-checksum-crc32c:sOO8/Q==\r\n"
                 b"x-amz-trailer-signature:d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435\r\n")


def _doc_body(signatures: tuple[str, str, str] = DOC_SIGNATURES, trailer: bytes = b"") -> bytes:
    return (f"10000;chunk-signature={signatures[0]}\r\n".encode() + DOC_DATA[:65536]
            + f"\r\n400;chunk-signature={signatures[1]}\r\n".encode() + DOC_DATA[65536:]
            + f"\r\n0;chunk-signature={signatures[2]}\r\n".encode() + trailer + b"\r\n")


def _doc_signing() -> ChunkSigning:
    """The signing material verify() hands over for the documented request."""
    request = WireRequest("PUT", "/examplebucket/chunkObject.txt", "", DOC_HEADERS)
    verified = verify(request, {"AKIAIOSFODNN7EXAMPLE": SECRET}.get, datetime(2013, 5, 24, 0, 0, 30, tzinfo=UTC))
    assert verified.payload is PayloadMode.STREAMING_SIGNED and verified.signing is not None
    return verified.signing


def _trailer_signing() -> ChunkSigning:
    return ChunkSigning(signing_key(SECRET, "20130524", "us-east-1"), TRAILER_SEED, DOC_DATE, DOC_SCOPE)


def _decode(decoder: ChunkedDecoder, body: bytes, step: int) -> tuple[bytes, dict[str, str]]:
    out = bytearray()
    for start in range(0, len(body), step):
        for piece in decoder.feed(body[start:start + step]):
            out += piece
    return bytes(out), decoder.finish()


def _refused(code: str, decoder: ChunkedDecoder, body: bytes, step: int = 4096) -> None:
    with pytest.raises(S3Error) as caught:
        _decode(decoder, body, step)
    assert caught.value.code == code, caught.value


@pytest.mark.parametrize("step", [1, 7, 1000, 65536, 70000, 1 << 20])
def test_the_documented_signed_upload_decodes_at_any_slicing(step: int) -> None:
    decoder = ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing(), decoded_length=66560)
    body = _doc_body()
    assert len(body) == 66824  # the documented Content-Length
    assert _decode(decoder, body, step) == (DOC_DATA, {})


def test_the_documented_upload_fed_as_memoryviews_and_bytearrays_decodes() -> None:
    decoder = ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing())
    body = _doc_body()
    pieces = [*decoder.feed(memoryview(body)[:30000]), *decoder.feed(bytearray(body[30000:]))]
    assert b"".join(pieces) == DOC_DATA and decoder.finish() == {}


@pytest.mark.parametrize("index", [0, 1, 2])
def test_any_documented_chunk_signature_changed_is_refused(index: int) -> None:
    signatures = list(DOC_SIGNATURES)
    signatures[index] = signatures[index][:-1] + ("0" if signatures[index][-1] != "0" else "1")
    body = _doc_body((signatures[0], signatures[1], signatures[2]))
    _refused("SignatureDoesNotMatch", ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing()), body)


@pytest.mark.parametrize("position", [88, 88 + 65535, 65712, 65712 + 1023])
def test_a_flipped_data_byte_is_refused(position: int) -> None:
    """88: the first chunk's data starts after its 88-byte header; 65712: the second chunk's."""
    body = bytearray(_doc_body())
    assert body[position] == ord("a")
    body[position] = ord("b")
    _refused("SignatureDoesNotMatch", ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing()), bytes(body), 1)


def test_a_wrong_seed_breaks_the_chain() -> None:
    signing = _doc_signing()
    other = ChunkSigning(signing.key, "0" * 64, signing.amz_date, signing.scope)
    _refused("SignatureDoesNotMatch", ChunkedDecoder(PayloadMode.STREAMING_SIGNED, other), _doc_body())


@pytest.mark.parametrize("cut", [1, 2, 40, 86, 1000, 66824 - 88, 66824 - 2])
def test_a_truncated_body_fails_on_finish(cut: int) -> None:
    decoder = ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing())
    for _piece in decoder.feed(_doc_body()[:-cut]):
        pass
    with pytest.raises(S3Error) as caught:
        decoder.finish()
    assert caught.value.code == "IncompleteBody"


def test_the_decoded_length_is_held_to_its_header() -> None:
    _refused("IncompleteBody", ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing(), 66561), _doc_body())
    _refused("IncompleteBody", ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing(), 66559), _doc_body())


@pytest.mark.parametrize("step", [1, 13, 70000])
def test_the_documented_signed_trailer_upload_decodes(step: int) -> None:
    decoder = ChunkedDecoder(PayloadMode.STREAMING_SIGNED_TRAILER, _trailer_signing(), 66560, ["x-amz-checksum-crc32c"])
    data, trailers = _decode(decoder, _doc_body(TRAILER_SIGNATURES, TRAILER_LINES), step)
    assert data == DOC_DATA and trailers == {"x-amz-checksum-crc32c": "sOO8/Q=="}
    digests = UploadDigests(trailer_names=["x-amz-checksum-crc32c"])
    digests.update(data)
    assert digests.check(trailers).checksums == {"x-amz-checksum-crc32c": "sOO8/Q=="}


def test_the_signed_trailer_with_an_lf_before_its_signature_line_decodes() -> None:
    body = _doc_body(TRAILER_SIGNATURES, TRAILER_LINES.replace(b"==\r\n", b"==\n\r\n"))
    decoder = ChunkedDecoder(PayloadMode.STREAMING_SIGNED_TRAILER, _trailer_signing())
    assert _decode(decoder, body, 999)[1] == {"x-amz-checksum-crc32c": "sOO8/Q=="}


@pytest.mark.parametrize("change,code", [
    ((b"sOO8/Q==", b"sOO8/A=="), "SignatureDoesNotMatch"),
    ((b"signature:d81f", b"signature:e81f"), "SignatureDoesNotMatch"),
    ((b"x-amz-trailer-signature:d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435\r\n", b""),
     "IncompleteBody"),  # still waiting for the signature line when the body ends
], ids=["value", "signature", "missing-signature"])
def test_a_changed_signed_trailer_is_refused(change: tuple[bytes, bytes], code: str) -> None:
    body = _doc_body(TRAILER_SIGNATURES, TRAILER_LINES.replace(*change))
    _refused(code, ChunkedDecoder(PayloadMode.STREAMING_SIGNED_TRAILER, _trailer_signing()), body)


def _botocore_body(data: bytes, checksum: type | None = Crc32Checksum, chunk_size: int = 8192) -> bytes:
    wrapper = AwsChunkedWrapper(io.BytesIO(data), checksum_cls=checksum, checksum_name="x-amz-checksum-crc32",
                                chunk_size=chunk_size)
    return wrapper.read()


@pytest.mark.parametrize("step", [1, 100, 8192, 1 << 20])
def test_botocore_unsigned_trailer_body_decodes_and_its_crc32_checks(step: int) -> None:
    data = bytes(range(256)) * 200
    body = _botocore_body(data)
    assert body.endswith(b"\r\n\r\n") and b"x-amz-checksum-crc32:" in body
    decoder = ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER, None, len(data), ["x-amz-checksum-crc32"])
    decoded, trailers = _decode(decoder, body, step)
    assert decoded == data
    digests = UploadDigests(trailer_names=["x-amz-checksum-crc32"])
    digests.update(decoded)
    assert digests.check(trailers).checksums == trailers


def test_a_botocore_body_with_a_changed_byte_decodes_but_its_crc32_fails() -> None:
    data = b"x" * 20000
    body = bytearray(_botocore_body(data))
    body[100] = ord("y")
    decoded, trailers = _decode(ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER), bytes(body), 4096)
    digests = UploadDigests(trailer_names=["x-amz-checksum-crc32"])
    digests.update(decoded)
    with pytest.raises(S3Error) as caught:
        digests.check(trailers)
    assert caught.value.code == "BadDigest"


def test_an_unsigned_body_that_ends_right_after_its_last_chunk_is_whole() -> None:
    decoder = ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER, None, 3)
    assert _decode(decoder, b"3\r\nabc\r\n0\r\n", 1) == (b"abc", {})


def test_an_empty_body_with_a_sha256_trailer_decodes() -> None:
    body = _botocore_body(b"", Sha256Checksum).replace(b"x-amz-checksum-crc32", b"x-amz-checksum-sha256")
    decoded, trailers = _decode(ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER, None, 0), body, 5)
    empty = base64.b64encode(hashlib.sha256().digest()).decode()
    assert decoded == b"" and trailers == {"x-amz-checksum-sha256": empty}
    digests = UploadDigests(trailer_names=["x-amz-checksum-sha256"])
    assert digests.check(trailers).checksums == trailers


def test_trailers_other_than_those_declared_are_refused() -> None:
    body = _botocore_body(b"abc")
    _refused("InvalidRequest", ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER, None, None,
                                              ["x-amz-checksum-crc32c"]), body)
    _refused("InvalidRequest", ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER, None, None, []), body)


@pytest.mark.parametrize("body", [
    b"zz\r\nab\r\n0\r\n\r\n",  # size not hex
    b"2\r\nabc\r\n0\r\n\r\n",  # data longer than its size
    b"2\r\nab\r\n0\r\n\r\nmore",  # bytes after the end
    b"%x\r\n" % (MAX_CHUNK + 1),  # a chunk over the limit
    b"1" * (MAX_LINE + 10),  # a size line that never ends
    b"2;" + b"x" * MAX_LINE + b"\r\nab\r\n",  # a size line over the limit, ended
    b"2\r\nab\r\n0\r\nno-colon\r\n\r\n",  # a trailer that is not name:value
])
def test_malformed_framing_is_refused(body: bytes) -> None:
    _refused("InvalidRequest", ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER), body, 3)


def test_a_signed_chunk_without_its_signature_is_refused() -> None:
    body = re.sub(rb";chunk-signature=[0-9a-f]{64}", b"", _doc_body(), count=1)
    _refused("InvalidRequest", ChunkedDecoder(PayloadMode.STREAMING_SIGNED, _doc_signing()), body)


def test_a_decoder_that_failed_keeps_failing() -> None:
    decoder = ChunkedDecoder(PayloadMode.STREAMING_UNSIGNED_TRAILER)
    with pytest.raises(S3Error):
        decoder.feed(b"zz\r\n")
    with pytest.raises(S3Error):
        decoder.feed(b"0\r\n\r\n")
    with pytest.raises(S3Error):
        decoder.finish()


def _sign_chunks(signing: ChunkSigning, data: bytes, size: int) -> bytes:
    """A signed aws-chunked body as an SDK frames it (the test's own signer, checked above on the AWS example)."""
    out, previous = bytearray(), signing.seed_signature
    for chunk in [data[i:i + size] for i in range(0, len(data), size)] + [b""]:
        text = (f"AWS4-HMAC-SHA256-PAYLOAD\n{signing.amz_date}\n{signing.scope}\n{previous}\n"
                f"{hashlib.sha256(b'').hexdigest()}\n{hashlib.sha256(chunk).hexdigest()}")
        previous = hmac.new(signing.key, text.encode(), hashlib.sha256).hexdigest()
        out += f"{len(chunk):x};chunk-signature={previous}\r\n".encode() + chunk + b"\r\n"
    return bytes(out)


def test_the_test_signer_reproduces_the_documented_body() -> None:
    signing = _doc_signing()
    assert _sign_chunks(signing, DOC_DATA, 65536) == _doc_body()


def test_swapped_chunks_break_the_chain() -> None:
    signing = _doc_signing()
    body = _sign_chunks(signing, b"A" * 100 + b"B" * 100, 100)
    first, second = body[:body.index(b"\r\n64;") + 2], body[body.index(b"\r\n64;") + 2:body.index(b"\r\n0;") + 2]
    swapped = second + first + body[len(first) + len(second):]
    _refused("SignatureDoesNotMatch", ChunkedDecoder(PayloadMode.STREAMING_SIGNED, signing), swapped)


def test_one_mib_signed_chunks_decode_as_views_without_copies() -> None:
    signing = _doc_signing()
    data = bytes(range(256)) * 4096 * 3
    body = _sign_chunks(signing, data, 1 << 20)
    decoder = ChunkedDecoder(PayloadMode.STREAMING_SIGNED, signing, len(data))
    pieces = decoder.feed(body)
    assert all(isinstance(piece, memoryview) and piece.obj is body for piece in pieces)
    assert b"".join(pieces) == data and decoder.finish() == {}
