from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.location import MAX_BLOB_SIZE, Location, SliceInfo
from blobstore_server.libs.proto.uploads import MAX_TOKEN_LEN, BlobToken
from blobstore_server.libs.proto.widths import U32_MAX, U64_MAX
from blobstore_server.libs.rpc.errors import BadRequest, Forbidden

SECRET = b"upload-test-secret"
NOW = 1_800_000_000


@given(cluster=st.integers(0, U32_MAX), vid=st.integers(0, U32_MAX), bid=st.integers(0, U64_MAX),
       size=st.integers(0, MAX_BLOB_SIZE), ttl=st.integers(0, 10**6))
def test_a_token_reads_back_until_it_expires(cluster: int, vid: int, bid: int, size: int, ttl: int) -> None:
    token = BlobToken(cluster, vid, bid, size, NOW + ttl)
    text = token.to_token(SECRET)
    assert len(text) <= MAX_TOKEN_LEN
    assert BlobToken.from_token(text, SECRET, NOW) == token
    with pytest.raises(Forbidden, match="expired"):
        BlobToken.from_token(text, SECRET, NOW + ttl + 1)


def test_forged_altered_and_foreign_tokens_are_refused() -> None:
    text = BlobToken(1, 7, 42, 1000, NOW + 60).to_token(SECRET)
    with pytest.raises(Forbidden, match="signature"):
        BlobToken.from_token(text, b"another-cluster", NOW)
    flipped = text[:3] + ("A" if text[3] != "A" else "B") + text[4:]
    with pytest.raises((Forbidden, BadRequest)):
        BlobToken.from_token(flipped, SECRET, NOW)
    with pytest.raises(BadRequest):
        BlobToken.from_token("not a token!", SECRET, NOW)
    # A Location is signed with the same secret but is never an upload token.
    location = Location(1, CodeMode.EC3P3, 10, 4 << 20, 0, (SliceInfo(min_bid=1, vid=2, count=1),))
    with pytest.raises(BadRequest, match="not an upload token"):
        BlobToken.from_token(location.to_token(SECRET), SECRET, NOW)


def test_a_token_field_out_of_range_is_refused_when_made() -> None:
    with pytest.raises(ValueError):
        BlobToken(1, 7, 42, MAX_BLOB_SIZE + 1, NOW)
