from __future__ import annotations

import base64
import hashlib
import hmac
from itertools import islice

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.location import (
    MAX_BLOB_SIZE,
    MAX_OBJECT_SIZE,
    MAX_SLICES,
    MAX_TOKEN_LEN,
    Location,
    SliceInfo,
)
from blobstore_server.libs.proto.tokens import MAC_SIZE
from blobstore_server.libs.proto.widths import U32_MAX, U64_MAX
from blobstore_server.libs.rpc.errors import BadRequest, Forbidden

SECRET = b"cluster-secret-0123456789abcdef"
MiB = 1 << 20


def one_slice(size: int, blob_size: int = 4 * MiB, mode: CodeMode = CodeMode.EC6P3) -> Location:
    count = -(-size // blob_size)
    blobs = (SliceInfo(min_bid=1_000_000_007, vid=4242, count=count),) if count else ()
    return Location(cluster_id=7, code_mode=mode, size=size, blob_size=blob_size, crc=0xDEADBEEF, blobs=blobs)


def sign(body: bytes, secret: bytes = SECRET) -> str:
    raw = body + hmac.new(secret, body, hashlib.sha256).digest()[:MAC_SIZE]
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def raw_of(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


@st.composite
def locations(draw: st.DrawFn) -> Location:
    blob_size = draw(st.sampled_from([1, 2, 4096, 4 * MiB, MAX_BLOB_SIZE]) | st.integers(1, MAX_BLOB_SIZE))
    max_blobs = min(MAX_OBJECT_SIZE // blob_size, 4 * U32_MAX)
    count = draw(st.integers(0, max_blobs))
    size = 0 if count == 0 else draw(st.integers((count - 1) * blob_size + 1, min(count * blob_size, MAX_OBJECT_SIZE)))
    slices: list[SliceInfo] = []
    left = count
    while left:
        n = left if len(slices) == MAX_SLICES - 1 else draw(
            st.integers(max(1, left - U32_MAX * (3 - len(slices))), min(left, U32_MAX)))
        slices.append(SliceInfo(min_bid=draw(st.integers(0, U64_MAX - n + 1)), vid=draw(st.integers(0, U32_MAX)),
                                count=n))
        left -= n
    return Location(
        cluster_id=draw(st.integers(0, U32_MAX)),
        code_mode=draw(st.sampled_from(list(CodeMode))),
        size=size,
        blob_size=blob_size,
        crc=draw(st.integers(0, U32_MAX)),
        blobs=tuple(slices),
    )


@settings(max_examples=400, deadline=None)
@given(locations())
def test_round_trip(loc: Location) -> None:
    token = loc.to_token(SECRET)
    assert len(token) <= MAX_TOKEN_LEN
    back = Location.from_token(token, SECRET)
    assert back == loc
    assert type(back.code_mode) is CodeMode
    count = loc.blob_count
    assert count == sum(s.count for s in loc.blobs)
    ids = list(islice(back.blob_ids(), 1000))
    assert ids == list(islice(loc.blob_ids(), 1000))
    assert len(ids) == min(count, 1000)
    if count:
        assert ids[0] == (loc.blobs[0].vid, loc.blobs[0].min_bid)
        assert loc.blob_len(0) == min(loc.blob_size, loc.size)
        assert loc.blob_len(count - 1) == loc.size - (count - 1) * loc.blob_size


def test_typical_one_slice_location_is_small() -> None:
    loc = one_slice(4 * MiB - 1)  # bid ~1e9, vid 4242, cluster 7
    assert len(raw_of(loc.to_token(SECRET))) - MAC_SIZE == 24
    assert len(loc.to_token(SECRET)) == 54
    widest = Location(U32_MAX, CodeMode.EC6P3, MAX_OBJECT_SIZE, 2, U32_MAX,
                      (SliceInfo(U64_MAX - U32_MAX, U32_MAX, MAX_OBJECT_SIZE // 2),))
    assert len(raw_of(widest.to_token(SECRET))) - MAC_SIZE == 38  # the worst one-slice case


@pytest.mark.parametrize("size", [0, 1, 4 * MiB - 1, 4 * MiB, 4 * MiB + 1, 3 * 4 * MiB, MAX_OBJECT_SIZE])
def test_edge_sizes(size: int) -> None:
    loc = one_slice(size)
    assert Location.from_token(loc.to_token(SECRET), SECRET) == loc
    lens = [loc.blob_len(i) for i in range(loc.blob_count)]
    assert sum(lens) == size
    assert all(n == loc.blob_size for n in lens[:-1])
    assert not lens or 1 <= lens[-1] <= loc.blob_size
    assert loc.blob_count == -(-size // loc.blob_size)
    with pytest.raises(IndexError):
        loc.blob_len(loc.blob_count)
    with pytest.raises(IndexError):
        loc.blob_len(-1)


def test_blob_ids_run_through_slices_in_order() -> None:
    loc = Location(1, CodeMode.EC3P3, 10, 2, 0, (SliceInfo(100, 5, 2), SliceInfo(7, 6, 1), SliceInfo(50, 5, 2)))
    assert list(loc.blob_ids()) == [(5, 100), (5, 101), (6, 7), (5, 50), (5, 51)]
    assert [loc.blob_len(i) for i in range(5)] == [2, 2, 2, 2, 2]
    assert [one_slice(5, 2).blob_len(i) for i in range(3)] == [2, 2, 1]


def test_every_bit_flip_and_truncation_is_refused() -> None:
    loc = Location(3, CodeMode.EC4P4L2, 9 * MiB + 5, 4 * MiB, 12345, (SliceInfo(1 << 40, 77, 2), SliceInfo(9, 78, 1)))
    token = loc.to_token(SECRET)
    raw = raw_of(token)
    for bit in range(len(raw) * 8):
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(Forbidden):
            Location.from_token(base64.urlsafe_b64encode(flipped).rstrip(b"=").decode(), SECRET)
    # Bit flips of the text itself: another alphabet character changes the bytes, anything else is not base64url.
    for i, ch in enumerate(token):
        for bit in range(8):
            other = chr(ord(ch) ^ (1 << bit))
            with pytest.raises((Forbidden, BadRequest)):
                Location.from_token(token[:i] + other + token[i + 1 :], SECRET)
    for cut in range(len(token)):
        with pytest.raises((Forbidden, BadRequest)):
            Location.from_token(token[:cut], SECRET)
    for cut in range(len(raw)):
        with pytest.raises((Forbidden, BadRequest)):
            Location.from_token(base64.urlsafe_b64encode(raw[:cut]).rstrip(b"=").decode(), SECRET)


def test_other_secret_is_forbidden() -> None:
    token = one_slice(100).to_token(b"another cluster's secret")
    with pytest.raises(Forbidden, match="signature"):
        Location.from_token(token, SECRET)


def test_empty_secret_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="secret"):
        one_slice(1).to_token(b"")


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("", "too short"),
        ("AQ", "too short"),
        ("a" * (MAX_TOKEN_LEN + 1), "too long"),
        ("abc+def/", "not base64url"),
        ("abcd====", "not base64url"),
        ("abc d", "not base64url"),
        ("ab\u00e9d", "not base64url"),
        ("abcde", "not base64url"),  # 5 characters cannot come from whole bytes
        ("AR", "not canonical"),  # the low 4 bits of the last character must be zero
    ],
)
def test_malformed_token_text_is_bad_request(token: str, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        Location.from_token(token, SECRET)


def test_non_string_token_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="string"):
        Location.from_token(b"AQ", SECRET)  # type: ignore[arg-type]


GOOD_BODY = one_slice(100)._body()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x02" + GOOD_BODY[1:], "version 2"),
        (b"\x00", "version 0"),
        (GOOD_BODY + b"\x00", "trailing"),
        (GOOD_BODY[:-1], "ends early"),
        (b"\x01\x07", "ends early"),
        (b"\x01" + b"\x80" * 11, "longer than 10"),
        (b"\x01\x87\x00", "overlong"),
        (b"\x01\x07\x63" + GOOD_BODY[3:], "code mode 99"),  # unknown code mode
        (b"\x01\x80\x80\x80\x80\x10" + GOOD_BODY[2:], "cluster_id"),  # 2**32
        (b"\x01\x07\x0d\x00\x00" + b"\x00" * 4 + b"\x00", "blob_size 0"),
        (b"\x01\x07\x0d\x01\x01" + b"\x00" * 4 + b"\x00", "slices hold 0 blobs"),
        (b"\x01\x07\x0d\x02\x01" + b"\x00" * 4 + b"\x01\x01\x01\x01", "slices hold 1 blobs"),
        (b"\x01\x07\x0d\x00\x01" + b"\x00" * 4 + b"\x01\x01\x01\x00", "count 0"),
        (b"\x01\x07\x0d\x05\x01" + b"\x00" * 4 + b"\x05" + b"\x01\x01\x01" * 5, "5 slices"),
        (b"\x01\x07\x0d" + b"\x81\x80\x80\x80\x14" + b"\x01" + b"\x00" * 4 + b"\x00", "size"),  # 5 GiB + 1
    ],
)
def test_malformed_signed_body_is_bad_request(body: bytes, reason: str) -> None:
    """Bodies only a holder of the secret could sign (e.g. a future version): still refused with a reason."""
    with pytest.raises(BadRequest, match=reason):
        Location.from_token(sign(body), SECRET)


def test_signed_good_body_decodes() -> None:
    assert Location.from_token(sign(GOOD_BODY), SECRET) == one_slice(100)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cluster_id": -1},
        {"cluster_id": U32_MAX + 1},
        {"code_mode": 6},
        {"code_mode": 13},  # a number is no CodeMode: the token's reader turns its number into one
        {"code_mode": True},
        {"size": MAX_OBJECT_SIZE + 1},
        {"size": -1},
        {"blob_size": 0},
        {"blob_size": MAX_BLOB_SIZE + 1},
        {"crc": U32_MAX + 1},
        {"size": 1.0},
        {"blobs": ()},
        {"blobs": [SliceInfo(1, 1, 1)]},
        {"blobs": (SliceInfo(1, 1, 2),)},
        {"size": 0},
        {"size": 5, "blob_size": 1, "blobs": tuple(SliceInfo(i, 1, 1) for i in range(5))},
    ],
)
def test_invalid_location_is_refused_at_construction(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "cluster_id": 1, "code_mode": CodeMode.EC6P3, "size": 10, "blob_size": 16, "crc": 0,
        "blobs": (SliceInfo(1, 1, 1),),
    }
    with pytest.raises(ValueError):
        Location(**(fields | kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("min_bid", "vid", "count"),
    [(-1, 1, 1), (U64_MAX, 1, 2), (U64_MAX + 1, 1, 1), (1, U32_MAX + 1, 1), (1, -1, 1), (1, 1, 0),
     (1, 1, U32_MAX + 1), (True, 1, 1)],
)
def test_invalid_slice_is_refused(min_bid: int, vid: int, count: int) -> None:
    with pytest.raises(ValueError):
        SliceInfo(min_bid, vid, count)


def test_slice_may_end_at_the_last_bid() -> None:
    loc = Location(1, CodeMode.EC3P3, 2, 1, 0, (SliceInfo(U64_MAX - 1, 1, 2),))
    assert list(loc.blob_ids()) == [(1, U64_MAX - 1), (1, U64_MAX)]
