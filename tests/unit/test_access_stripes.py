from __future__ import annotations

from functools import cache
from itertools import combinations_with_replacement

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from blobstore_server.libs.ec import ALIGN_2KB, Codec, CodeMode, tactic
from blobstore_server.libs.rpc.errors import BadRequest, RangeNotSatisfiable
from blobstore_server.services.access.stripes import (
    JOIN_BELOW,
    BlobRange,
    ShardRead,
    assemble,
    parse_range,
    plan_range,
    plan_runs,
    shard_reads,
    split_object,
)

MODES = [CodeMode.EC3P3, CodeMode.EC6P3, CodeMode.EC4P4L2]


def pattern(size: int) -> bytes:
    """Object bytes whose value shifts with position (251 is prime), so a misplaced piece shows."""
    return bytes(i % 251 for i in range(size))


@cache
def encoded(mode: CodeMode, blob: bytes) -> list[bytes]:
    return [bytes(s) for s in Codec(mode).encode(blob)]


def read_through_shards(mode: CodeMode, obj: bytes, blob_size: int, offset: int, length: int) -> bytes:
    """What access would return: plan the range, read the planned shard pieces, join them."""
    t = tactic(mode)
    out = []
    lens = split_object(len(obj), blob_size)
    for blob_index, start, end in plan_range(len(obj), blob_size, offset, length):
        blob = obj[blob_index * blob_size : blob_index * blob_size + lens[blob_index]]
        assert 0 <= start < end <= len(blob)
        shards = encoded(mode, blob)
        s = t.shard_size(len(blob))
        reads = shard_reads(t, len(blob), start, end)
        for r in reads:
            assert 0 <= r.shard_index < t.n  # data shards only
            assert r.length > 0 and r.offset + r.length <= s
            assert r.shard_index * s + r.offset + r.length <= len(blob)  # never the zero padding
        out.append(b"".join(assemble(reads, [shards[r.shard_index][r.offset : r.offset + r.length] for r in reads])))
    return b"".join(out)


@st.composite
def cases(draw: st.DrawFn) -> tuple[CodeMode, int, int, int, int]:
    mode = draw(st.sampled_from(MODES))
    n = tactic(mode).n
    stripe = n * ALIGN_2KB  # a blob above this has shards larger than the minimum
    blob_size = draw(st.sampled_from([1, 7, ALIGN_2KB - 1, ALIGN_2KB + 1, stripe - 1, stripe, stripe + 1,
                                      3 * stripe + 5]))
    size = draw(st.sampled_from([0, 1, blob_size - 1, blob_size, blob_size + 1, 3 * blob_size - 1])
                | st.integers(0, 4 * blob_size))
    size = min(size, 200 * blob_size)
    # Ranges that straddle a shard boundary of the first blob are the interesting ones; mix in any range.
    s = tactic(mode).shard_size(min(blob_size, size))
    around = [min(size, k * s + d) for k in range(1, n) for d in (-1, 0, 1) if k * s + d >= 0]
    offset = draw(st.integers(0, size) | st.sampled_from([0, size, *around]))
    length = draw(st.integers(0, size - offset) | st.sampled_from(sorted({min(size - offset, x) for x in (0, 1, 2)})))
    return mode, size, blob_size, offset, length


@settings(max_examples=500, deadline=None)
@given(cases())
@example((CodeMode.EC3P3, 0, 4096, 0, 0))
@example((CodeMode.EC6P3, 1, 12288, 0, 1))
@example((CodeMode.EC4P4L2, 8193, 8192, 2047, 2))  # straddles shard 0/1 of blob 0
@example((CodeMode.EC4P4L2, 8193, 8192, 8191, 2))  # straddles blob 0 / blob 1
@example((CodeMode.EC6P3, 3 * 12289 + 5, 12289, 0, 3 * 12289 + 5))
def test_planned_pieces_rebuild_the_range(case: tuple[CodeMode, int, int, int, int]) -> None:
    mode, size, blob_size, offset, length = case
    obj = pattern(size)
    assert read_through_shards(mode, obj, blob_size, offset, length) == obj[offset : offset + length]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("blob_len", [0, 1, ALIGN_2KB, 3 * ALIGN_2KB + 1, 6 * 4096 - 1, 6 * 4096 + 1])
def test_shard_reads_at_every_shard_boundary(mode: CodeMode, blob_len: int) -> None:
    t = tactic(mode)
    s = t.shard_size(blob_len)
    blob = pattern(blob_len)
    shards = encoded(mode, blob)
    marks = sorted({p for k in range(t.n + 1) for p in (k * s - 1, k * s, k * s + 1) if 0 <= p <= blob_len}
                   | {0, blob_len})
    for start, end in combinations_with_replacement(marks, 2):
        reads = shard_reads(t, blob_len, start, end)
        pieces = [shards[r.shard_index][r.offset : r.offset + r.length] for r in reads]
        assert b"".join(assemble(reads, pieces)) == blob[start:end]
        assert sum(r.length for r in reads) == end - start
        assert all(r.length > 0 for r in reads)


def test_shard_reads_small_blob_reads_one_shard() -> None:
    t = tactic(CodeMode.EC6P3)
    assert shard_reads(t, 100, 10, 60) == [ShardRead(0, 10, 50)]
    s = t.shard_size(6 * 4096)
    assert shard_reads(t, 6 * 4096, s - 1, 2 * s + 1) == [
        ShardRead(0, s - 1, 1), ShardRead(1, 0, s), ShardRead(2, 0, 1)
    ]
    assert shard_reads(t, 100, 50, 50) == []
    with pytest.raises(ValueError):
        shard_reads(t, 100, 50, 101)
    with pytest.raises(ValueError):
        shard_reads(t, 100, 60, 50)


def test_split_object() -> None:
    assert split_object(0, 4) == []
    assert split_object(1, 4) == [1]
    assert split_object(4, 4) == [4]
    assert split_object(9, 4) == [4, 4, 1]
    assert split_object(5 << 30, 4 << 20) == [4 << 20] * 1280
    with pytest.raises(ValueError):
        split_object(-1, 4)
    with pytest.raises(ValueError):
        split_object(4, 0)


def test_plan_runs_groups_consecutive_blobs_of_one_volume_up_to_the_limit() -> None:
    parts = plan_range(10 * 4, 4, 2, 37)  # blobs 0..9, the first and last partly
    vids = [7, 7, 7, 8, 8, 7, 7, 7, 7, 7]
    runs = plan_runs(parts, vids, 2)
    assert [[p.blob_index for p in run] for run in runs] == [[0, 1], [2], [3, 4], [5, 6], [7, 8], [9]]
    assert [p for run in runs for p in run] == parts  # every part once, in order
    assert [[p.blob_index for p in run] for run in plan_runs(parts, vids, 1)] == [[i] for i in range(10)]
    assert [len(run) for run in plan_runs(parts, vids, 16)] == [3, 2, 5]
    assert plan_runs([], [], 2) == []
    with pytest.raises(ValueError):
        plan_runs(parts, vids[:-1], 2)
    with pytest.raises(ValueError):
        plan_runs(parts, vids, 0)


def test_plan_range_every_range_of_a_small_object() -> None:
    size, blob_size = 10, 3
    obj = pattern(size)
    blobs = [obj[i : i + blob_size] for i in range(0, size, blob_size)]
    for offset in range(size + 1):
        for length in range(size - offset + 1):
            plan = plan_range(size, blob_size, offset, length)
            assert b"".join(blobs[b][s:e] for b, s, e in plan) == obj[offset : offset + length]
            assert all(0 <= s < e <= len(blobs[b]) for b, s, e in plan)
            assert [b for b, _, _ in plan] == sorted({b for b, _, _ in plan})
    assert plan_range(10, 3, 2, 5) == [BlobRange(0, 2, 3), BlobRange(1, 0, 3), BlobRange(2, 0, 1)]
    assert plan_range(0, 3, 0, 0) == []


@pytest.mark.parametrize(("offset", "length"), [(11, 0), (10, 1), (0, 11), (5, 6)])
def test_plan_range_outside_the_object_is_416(offset: int, length: int) -> None:
    with pytest.raises(RangeNotSatisfiable, match=rf"\[{offset}, {offset + length}\) is outside the 10-byte object"):
        plan_range(10, 3, offset, length)


@pytest.mark.parametrize(("offset", "length"), [(-1, 2), (0, -1)])
def test_plan_range_negative_is_bad_request(offset: int, length: int) -> None:
    with pytest.raises(BadRequest, match="negative"):
        plan_range(10, 3, offset, length)


def test_assemble_refuses_pieces_that_do_not_match() -> None:
    reads = [ShardRead(0, 0, 2), ShardRead(1, 0, 3)]
    assert assemble(reads, [b"ab", memoryview(b"cde")]) == [b"abcde"]  # small: one piece
    big = [ShardRead(0, 0, JOIN_BELOW), ShardRead(1, 0, 3)]
    pieces = [bytes(JOIN_BELOW), b"cde"]
    assert all(a is b for a, b in zip(assemble(big, pieces), pieces, strict=True))  # large: as they are, no copy
    with pytest.raises(ValueError, match="shard 1 piece is 2 bytes, expected 3"):
        assemble(reads, [b"ab", b"cd"])
    with pytest.raises(ValueError, match="1 pieces for 2 reads"):
        assemble(reads, [b"ab"])


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        (None, 100, None),
        (None, 0, None),
        ("bytes=0-0", 100, (0, 1)),
        ("bytes=0-99", 100, (0, 100)),
        ("bytes=10-19", 100, (10, 10)),
        ("bytes=10-1000", 100, (10, 90)),  # last past the end is clamped
        ("bytes=99-", 100, (99, 1)),
        ("bytes=0-", 100, (0, 100)),
        ("bytes=-1", 100, (99, 1)),
        ("bytes=-100", 100, (0, 100)),
        ("bytes=-1000", 100, (0, 100)),  # a suffix longer than the object selects all of it
        ("BYTES=1-2", 100, (1, 2)),  # the unit is case-insensitive
        (" bytes=1-2 ", 100, (1, 2)),
        ("bytes=0-" + "9" * 40, 100, (0, 100)),
    ],
)
def test_parse_range(header: str | None, size: int, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == expected


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("", "not bytes="),
        ("bytes=", "not bytes="),
        ("bytes=-", "not bytes="),
        ("bytes=a-b", "not bytes="),
        ("bytes=1-2-3", "not bytes="),
        ("bytes=+1-2", "not bytes="),
        ("bytes=1_0-20", "not bytes="),
        ("bytes=\u0661-2", "not bytes="),  # a non-ASCII digit
        ("bytes = 1-2", "not bytes="),
        ("items=1-2", "not bytes="),
        ("1-2", "not bytes="),
        ("bytes=0-1,5-6", "single byte range"),
        ("bytes=0-1, 5-6", "single byte range"),
        ("bytes=5-4", "last byte 4 is before first byte 5"),
        ("bytes=0-" + "9" * 300, "longer than 200"),
    ],
)
def test_parse_range_malformed_is_bad_request(header: str, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        parse_range(header, 100)


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=100-", 100), ("bytes=100-200", 100), ("bytes=-0", 100),
        ("bytes=0-0", 0), ("bytes=-5", 0), ("bytes=0-", 0),  # an empty object has no byte to select
    ],
)
def test_parse_range_outside_the_object_is_416(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiable, match=f"{size}-byte object"):
        parse_range(header, size)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.data())
def test_parse_range_agrees_with_python_slicing(size: int, data: st.DataObject) -> None:
    first = data.draw(st.integers(0, size + 5))
    last = data.draw(st.integers(first, size + 10))
    obj = pattern(size)
    if first >= size:
        with pytest.raises(RangeNotSatisfiable):
            parse_range(f"bytes={first}-{last}", size)
        return
    offset, length = parse_range(f"bytes={first}-{last}", size) or (0, size)
    assert obj[offset : offset + length] == obj[first : last + 1]
    suffix = data.draw(st.integers(1, size + 5))
    offset, length = parse_range(f"bytes=-{suffix}", size) or (0, size)
    assert obj[offset : offset + length] == obj[-suffix:]
    plan_range(size, 4096, offset, length)  # whatever parse_range returns is a valid plan
