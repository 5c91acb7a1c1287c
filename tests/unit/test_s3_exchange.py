"""What a request's framing declares of its payload, as S3 reads it."""

from __future__ import annotations

import pytest

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.exchange import S3Request
from blobstore_server.services.s3.sigv4 import PayloadMode
from tests.support.s3_requests import s3_request


def put(headers: dict[str, str], payload: PayloadMode = PayloadMode.UNSIGNED) -> S3Request:
    return s3_request("PUT", "/photos/a.jpg", headers=headers, payload=payload)


def test_the_declared_length_is_content_length_or_the_decoded_one() -> None:
    assert put({"content-length": "10"}).declared_length() == 10
    assert put({"content-length": "0"}).declared_length() == 0
    streamed = {"content-length": "99", "x-amz-decoded-content-length": "10"}
    assert put(streamed, PayloadMode.STREAMING_UNSIGNED_TRAILER).declared_length() == 10
    assert put({"transfer-encoding": "chunked"}).declared_length() is None  # a plain chunked body


def test_a_body_framed_neither_way_is_missing_content_length() -> None:
    with pytest.raises(S3Error) as err:
        put({}).declared_length()
    assert (err.value.code, err.value.status) == ("MissingContentLength", 411)
