"""Upload digests: each algorithm S3 names right and wrong, as a header or as a trailer, against values computed
apart from the code (botocore's checksums, a plain-Python CRC-32C, the CRC catalogue's check values)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from botocore.httpchecksum import BaseChecksum, Crc32Checksum, Sha1Checksum, Sha256Checksum

from blobstore_server.services.s3.checksums import Digests, UploadDigests, composite
from blobstore_server.services.s3.errors import S3Error

DATA = bytes(range(256)) * 1000 + b"tail"


def _table(polynomial: int) -> list[int]:
    rows = []
    for byte in range(256):
        value = byte
        for _ in range(8):
            value = (value >> 1) ^ polynomial if value & 1 else value >> 1
        rows.append(value)
    return rows


class Crc32cChecksum(BaseChecksum):  # type: ignore[misc]
    """CRC-32C in plain Python, apart from the crc32c package the code uses (botocore's needs awscrt)."""

    TABLE = _table(0x82F63B78)

    def __init__(self) -> None:
        self._value = 0xFFFFFFFF

    def update(self, chunk: bytes) -> None:
        value = self._value
        for byte in chunk:
            value = self.TABLE[(value ^ byte) & 0xFF] ^ (value >> 8)
        self._value = value

    def digest(self) -> bytes:
        return (self._value ^ 0xFFFFFFFF).to_bytes(4, "big")


REFERENCE = {"crc32": Crc32Checksum, "crc32c": Crc32cChecksum, "sha1": Sha1Checksum, "sha256": Sha256Checksum}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _reference(algorithm: str, data: bytes = DATA) -> str:
    checksum = REFERENCE[algorithm]()
    checksum.update(data)
    return str(checksum.b64digest())


def _digest(digests: UploadDigests, data: bytes = DATA, trailers: dict[str, str] | None = None) -> Digests:
    for start in range(0, len(data), 4099):
        digests.update(memoryview(data)[start:start + 4099])
    return digests.check(trailers)


def test_md5_is_always_computed_and_nothing_else_is_echoed() -> None:
    assert _digest(UploadDigests()) == Digests(hashlib.md5(DATA).hexdigest(), {})


@pytest.mark.parametrize("algorithm,check,size", [("crc32", 0xCBF43926, 4), ("crc32c", 0xE3069283, 4),
                                                   ("crc64nvme", 0xAE8B14860A799888, 8)])
def test_the_crcs_give_their_published_check_values(algorithm: str, check: int, size: int) -> None:
    """The CRC catalogue's check value: the CRC of b"123456789"."""
    header = {f"x-amz-checksum-{algorithm}": _b64(check.to_bytes(size, "big"))}
    assert _digest(UploadDigests(checksum_headers=header), b"123456789").checksums == header
    with pytest.raises(S3Error) as caught:
        _digest(UploadDigests(checksum_headers=header), b"123456780")
    assert caught.value.code == "BadDigest"


@pytest.mark.parametrize("algorithm", sorted(REFERENCE))
def test_a_checksum_header_that_matches_is_echoed(algorithm: str) -> None:
    value = _reference(algorithm)
    digests = _digest(UploadDigests(checksum_headers={f"x-amz-checksum-{algorithm}": value}))
    assert digests.checksums == {f"x-amz-checksum-{algorithm}": value}


@pytest.mark.parametrize("algorithm", sorted(REFERENCE))
def test_a_checksum_header_that_does_not_match_is_bad_digest(algorithm: str) -> None:
    header = {f"x-amz-checksum-{algorithm}": _reference(algorithm, DATA + b"!")}
    with pytest.raises(S3Error) as caught:
        _digest(UploadDigests(checksum_headers=header))
    assert caught.value.code == "BadDigest"


@pytest.mark.parametrize("algorithm", sorted(REFERENCE))
def test_a_checksum_trailer_is_checked(algorithm: str) -> None:
    name = f"x-amz-checksum-{algorithm}"
    assert _digest(UploadDigests(trailer_names=[name]), trailers={name: _reference(algorithm)}).checksums == {
        name: _reference(algorithm)}
    with pytest.raises(S3Error) as caught:
        _digest(UploadDigests(trailer_names=[name]), trailers={name: _reference(algorithm, b"other")})
    assert caught.value.code == "BadDigest"


def test_an_undeclared_or_malformed_trailer_is_refused() -> None:
    with pytest.raises(S3Error) as caught:
        _digest(UploadDigests(trailer_names=["x-amz-checksum-crc32"]), trailers={"x-amz-checksum-crc32c": "AAAAAA=="})
    assert caught.value.code == "InvalidRequest"
    with pytest.raises(S3Error) as caught:
        _digest(UploadDigests(trailer_names=["x-amz-checksum-crc32"]), trailers={"x-amz-checksum-crc32": "nope"})
    assert caught.value.code == "InvalidRequest"


def test_the_sdk_algorithm_alone_is_computed_and_echoed() -> None:
    assert _digest(UploadDigests(sdk_algorithm="CRC32C")).checksums == {"x-amz-checksum-crc32c": _reference("crc32c")}


def test_crc64nvme_as_pyarrow_sends_it_is_checked_fed_in_pieces_and_never_composed() -> None:
    whole = UploadDigests(sdk_algorithm="CRC64NVME")
    value = _digest(whole).checksums["x-amz-checksum-crc64nvme"]
    name = "x-amz-checksum-crc64nvme"
    assert _digest(UploadDigests(trailer_names=[name]), trailers={name: value}).checksums == {name: value}
    assert composite([{name: value}, {name: value}]) == {}, "S3 gives multipart objects FULL_OBJECT CRC64NVME only"


@pytest.mark.parametrize("value", ["AAAA", "not base64!", "AAAAAAAA", ""])
def test_a_malformed_checksum_header_is_invalid_request(value: str) -> None:
    with pytest.raises(S3Error) as caught:
        UploadDigests(checksum_headers={"x-amz-checksum-crc32": value})
    assert caught.value.code == "InvalidRequest"


def test_two_checksum_algorithms_at_once_are_refused() -> None:
    with pytest.raises(S3Error) as caught:
        UploadDigests(checksum_headers={"x-amz-checksum-crc32": _reference("crc32"),
                                        "x-amz-checksum-sha1": _reference("sha1")})
    assert caught.value.code == "InvalidRequest"


def test_content_md5_right_wrong_and_malformed() -> None:
    right = _b64(hashlib.md5(DATA).digest())
    assert _digest(UploadDigests(content_md5=right)).md5_hex == hashlib.md5(DATA).hexdigest()
    with pytest.raises(S3Error) as caught:
        _digest(UploadDigests(content_md5=_b64(hashlib.md5(b"x").digest())))
    assert caught.value.code == "BadDigest"
    for malformed in ("zzz", _b64(b"short"), hashlib.md5(DATA).hexdigest()):
        with pytest.raises(S3Error) as caught:
            UploadDigests(content_md5=malformed)
        assert caught.value.code == "InvalidDigest"


def test_the_declared_sha256_right_and_wrong() -> None:
    assert _digest(UploadDigests(content_sha256=hashlib.sha256(DATA).hexdigest().upper())).checksums == {}
    with pytest.raises(S3Error) as caught:
        _digest(UploadDigests(content_sha256=hashlib.sha256(b"x").hexdigest()))
    assert caught.value.code == "XAmzContentSHA256Mismatch"


def test_the_declared_sha256_and_a_sha256_checksum_share_one_hash() -> None:
    digests = UploadDigests(content_sha256=hashlib.sha256(DATA).hexdigest(),
                            checksum_headers={"x-amz-checksum-sha256": _reference("sha256")})
    assert _digest(digests).checksums == {"x-amz-checksum-sha256": _reference("sha256")}


def test_from_headers_reads_what_boto3_sends() -> None:
    headers = {"content-md5": _b64(hashlib.md5(DATA).digest()), "x-amz-checksum-crc32": _reference("crc32"),
               "x-amz-sdk-checksum-algorithm": "CRC32", "x-amz-checksum-type": "FULL_OBJECT",
               "x-amz-trailer": "", "content-type": "a/b"}
    assert _digest(UploadDigests.from_headers(headers, None)).checksums == {"x-amz-checksum-crc32": _reference("crc32")}
    trailer = UploadDigests.from_headers({"x-amz-trailer": "x-amz-checksum-crc32c"}, hashlib.sha256(DATA).hexdigest())
    assert _digest(trailer, trailers={"x-amz-checksum-crc32c": _reference("crc32c")}).checksums == {
        "x-amz-checksum-crc32c": _reference("crc32c")}


@pytest.mark.parametrize("algorithm", sorted(REFERENCE))
def test_a_multipart_objects_checksum_is_the_composite_of_its_parts(algorithm: str) -> None:
    """S3's COMPOSITE checksum: the algorithm over the parts' binary checksums, base64, then -N."""
    name = f"x-amz-checksum-{algorithm}"
    parts = [DATA[:100_000], DATA[100_000:200_000], DATA[200_000:]]
    raws = [base64.b64decode(_reference(algorithm, part)) for part in parts]
    expected = f"{_reference(algorithm, b''.join(raws))}-3"
    assert composite([{name: _b64(raw)} for raw in raws]) == {name: expected}


def test_parts_without_one_shared_checksum_make_an_object_without_one() -> None:
    crc, sha = {"x-amz-checksum-crc32": _b64(bytes(4))}, {"x-amz-checksum-sha1": _b64(bytes(20))}
    assert composite([crc, {}]) == composite([crc, sha]) == composite([]) == composite([crc | sha]) == {}
    assert composite([crc, crc]) != {}
