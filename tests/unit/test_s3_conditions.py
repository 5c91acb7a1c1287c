"""Conditional reads and copies, and byte ranges and parts, decided as S3 documents them."""

from __future__ import annotations

import pytest

from blobstore_server.services.s3.conditions import byte_range, check_read, etag_matches, part_range
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace import ObjectRecord
from blobstore_server.services.s3.namespace.records import Extent

ETAG = "0cc175b9c0f1b6a831c399e269772661"
MODIFIED_MS = 1_700_000_000_500  # Tue, 14 Nov 2023 22:13:20 GMT (+ 0.5 s)
BEFORE, AT, AFTER = ("Tue, 14 Nov 2023 22:13:19 GMT", "Tue, 14 Nov 2023 22:13:20 GMT",
                     "Tue, 14 Nov 2023 22:13:21 GMT")


def outcome(headers: dict[str, str], **kw: str) -> str:
    try:
        check_read(headers, ETAG, MODIFIED_MS, **kw)
    except S3Error as exc:
        return exc.code
    return "ok"


def test_etag_lists_quotes_weak_and_star() -> None:
    assert etag_matches(f'"{ETAG}"', ETAG) and etag_matches(ETAG, f'"{ETAG}"')
    assert etag_matches(f'"x", W/"{ETAG}"', ETAG) and etag_matches("*", ETAG)
    assert not etag_matches('"x"', ETAG)


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, "ok"),
    ({"if-match": f'"{ETAG}"'}, "ok"),
    ({"if-match": '"other"'}, "PreconditionFailed"),
    ({"if-none-match": f'"{ETAG}"'}, "NotModified"),
    ({"if-none-match": '"other"'}, "ok"),
    ({"if-modified-since": AT}, "NotModified"),
    ({"if-modified-since": BEFORE}, "ok"),
    ({"if-unmodified-since": AT}, "ok"),
    ({"if-unmodified-since": BEFORE}, "PreconditionFailed"),
    ({"if-unmodified-since": "not a date"}, "ok"),
    # S3's precedence: a true If-Match wins over a false If-Unmodified-Since
    ({"if-match": ETAG, "if-unmodified-since": BEFORE}, "ok"),
    # a false If-None-Match (ETag matched) gives 304 even when If-Modified-Since is true
    ({"if-none-match": ETAG, "if-modified-since": BEFORE}, "NotModified"),
    # a true If-None-Match makes If-Modified-Since moot
    ({"if-none-match": '"other"', "if-modified-since": AFTER}, "ok"),
    ({"if-match": '"other"', "if-none-match": ETAG}, "PreconditionFailed"),
])
def test_read_conditions(headers: dict[str, str], expected: str) -> None:
    assert outcome(headers) == expected


def test_copy_source_conditions_fail_with_412_only() -> None:
    copy = {"prefix": "x-amz-copy-source-if-", "not_modified": "PreconditionFailed"}
    assert outcome({"x-amz-copy-source-if-none-match": ETAG}, **copy) == "PreconditionFailed"
    assert outcome({"x-amz-copy-source-if-modified-since": AFTER}, **copy) == "PreconditionFailed"
    assert outcome({"x-amz-copy-source-if-match": ETAG}, **copy) == "ok"
    assert outcome({"if-match": "other"}, **copy) == "ok"  # a copy reads only its own headers


@pytest.mark.parametrize(("header", "size", "expected"), [
    (None, 10, None), ("bytes=0-4", 10, (0, 4)), ("bytes=5-", 10, (5, 9)), ("bytes=-3", 10, (7, 9)),
    ("bytes=-30", 10, (0, 9)), ("bytes=4-100", 10, (4, 9)), ("bytes=9-9", 10, (9, 9)),
    ("bytes=0-1,3-4", 10, None), ("items=0-1", 10, None), ("bytes=4-2", 10, None), ("bytes=a-b", 10, None),
    ("bytes=-", 10, None), ("bytes = 1-2", 10, (1, 2)),
])
def test_ranges(header: str | None, size: int, expected: tuple[int, int] | None) -> None:
    assert byte_range(header, size) == expected


@pytest.mark.parametrize(("header", "size"), [("bytes=10-", 10), ("bytes=10-20", 10), ("bytes=0-", 0),
                                              ("bytes=-1", 0), ("bytes=-0", 10)])
def test_unsatisfiable_ranges_are_416(header: str, size: int) -> None:
    with pytest.raises(S3Error) as err:
        byte_range(header, size)
    assert err.value.code == "InvalidRange" and err.value.status == 416


# parts of 5, 5 and 2 bytes (sizes shrunk), the first two stored as two blobs each, the last as one
MULTIPART = ObjectRecord(b"k", 12, ETAG + "-3", MODIFIED_MS, parts_count=3, manifest=(
    Extent(0, 3, "a", 1), Extent(3, 2, "b", 1), Extent(5, 4, "c", 2), Extent(9, 1, "d", 2), Extent(10, 2, "e", 3)))
SINGLE = ObjectRecord(b"k", 7, ETAG, MODIFIED_MS, manifest=(Extent(0, 7, "a"),))


@pytest.mark.parametrize(("number", "record", "expected"), [
    ("1", MULTIPART, (0, 4)), ("2", MULTIPART, (5, 9)), ("3", MULTIPART, (10, 11)), ("1", SINGLE, (0, 6)),
    ("1", ObjectRecord(b"k", 0, ETAG, MODIFIED_MS), (0, -1)),  # an empty object: its one part, empty
    # an empty last part leaves no extent
    ("2", ObjectRecord(b"k", 5, ETAG + "-2", MODIFIED_MS, parts_count=2, manifest=(Extent(0, 5, "a", 1),)), (5, 4)),
])
def test_parts(number: str, record: ObjectRecord, expected: tuple[int, int]) -> None:
    assert part_range(number, record) == expected


@pytest.mark.parametrize(("number", "record", "code", "status"), [
    ("4", MULTIPART, "InvalidPartNumber", 416), ("2", SINGLE, "InvalidPartNumber", 416),
    ("0", MULTIPART, "InvalidArgument", 400), ("10001", MULTIPART, "InvalidArgument", 400),
    ("x", MULTIPART, "InvalidArgument", 400), ("-1", MULTIPART, "InvalidArgument", 400),
    # completed before extents carried their part: no bounds to answer with, and no guess
    ("1", ObjectRecord(b"k", 12, ETAG + "-3", MODIFIED_MS, parts_count=3, manifest=(Extent(0, 12, "a"),)),
     "NotImplemented", 501),
])
def test_parts_refused(number: str, record: ObjectRecord, code: str, status: int) -> None:
    with pytest.raises(S3Error) as err:
        part_range(number, record)
    assert (err.value.code, err.value.status) == (code, status)
