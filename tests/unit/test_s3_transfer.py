"""Which blob reads give a byte range of an S3 object, against a brute-force reference over random manifests
(empty and zero-size extents included) and every range; and how a body is cut into segments, checked with an
in-memory stand-in for the SDK (the real cluster is in tests/integration/test_s3_transfer.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstore import AsyncClient
from blobstore_server.services.s3.namespace.records import Extent, Manifest
from blobstore_server.services.s3.transfer import extents_for, read_object, write_object


def manifest_of(sizes: list[int]) -> Manifest:
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(Extent(offset, size, f"loc{i}") for i, (offset, size) in enumerate(zip(offsets, sizes, strict=True)))


def reference(manifest: Manifest, first: int, last: int) -> list[tuple[str, int, int]]:
    """Byte by byte: who holds each byte of the range, runs of one blob joined."""
    owner = [(e.location, i) for e in manifest for i in range(e.size)]
    reads: list[tuple[str, int, int]] = []
    for location, offset in owner[first:last + 1]:
        if reads and reads[-1][0] == location:
            reads[-1] = (location, reads[-1][1], reads[-1][2] + 1)
        else:
            reads.append((location, offset, 1))
    return reads


@st.composite
def manifests_and_ranges(draw: st.DrawFn) -> tuple[Manifest, int, int]:
    manifest = manifest_of(draw(st.lists(st.integers(0, 9), max_size=8)))
    size = sum(e.size for e in manifest)
    first = draw(st.integers(0, size))
    last = draw(st.integers(first - 1, size - 1)) if first < size else first - 1
    return manifest, first, last


@settings(max_examples=600)
@given(manifests_and_ranges())
def test_reads_for_a_range_are_the_bytes_of_the_range_blob_by_blob(case: tuple[Manifest, int, int]) -> None:
    manifest, first, last = case
    reads = extents_for(manifest, first, last)
    assert reads == reference(manifest, first, last)
    assert sum(size for _, _, size in reads) == last - first + 1
    assert all(size > 0 for _, _, size in reads), "no empty read of a zero-size extent"


def test_every_range_of_a_small_manifest() -> None:
    manifest = manifest_of([3, 0, 1, 4, 0])
    for first in range(9):
        for last in range(first - 1, 8):
            assert extents_for(manifest, first, last) == reference(manifest, first, last), (first, last)


@pytest.mark.parametrize(("first", "last"), [(-1, 3), (2, 8), (5, 3), (8, 8), (9, 8)])
def test_a_range_outside_the_object_is_refused(first: int, last: int) -> None:
    with pytest.raises(ValueError, match="not a range"):
        extents_for(manifest_of([3, 5]), first, last)


def test_an_empty_object_read_whole_reads_nothing() -> None:
    assert extents_for((), 0, -1) == []
    with pytest.raises(ValueError):
        extents_for((), 0, 0)


class MemoryBlobs:
    """The two SDK calls transfer.py makes, on a dict."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def put(self, data: memoryview) -> str:
        await asyncio.sleep(0)
        location = f"loc{len(self.blobs)}"
        self.blobs[location] = bytes(data)
        return location

    async def get_stream(self, location: str, offset: int, size: int, chunk_size: None) -> AsyncIterator[bytes]:
        yield self.blobs[location][offset:offset + size]


async def pieces(data: bytes, cuts: list[int]) -> AsyncIterator[bytes | memoryview]:
    start = 0
    for end in [*sorted(cuts), len(data)]:
        yield memoryview(data)[start:end] if end % 2 else data[start:end]
        start = end


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 40), st.lists(st.integers(0, 200), max_size=10))
def test_a_body_is_cut_into_full_segments_and_a_tail_recorded_in_order(data: bytes, segment_size: int,
                                                                     cuts: list[int]) -> None:
    blobs = MemoryBlobs()
    recorded: list[Extent] = []
    finals: list[bool] = []
    seen = bytearray()

    async def record(extent: Extent, final: bool) -> None:
        recorded.append(extent)
        finals.append(final)

    async def run() -> bytes:
        client = cast(AsyncClient, blobs)
        manifest = await write_object(client, pieces(data, [min(c, len(data)) for c in cuts]), segment_size, record,
                                      seen.extend)
        assert list(manifest) == recorded
        return b"".join([piece async for piece in read_object(client, manifest, 0, len(data) - 1)])

    assert asyncio.run(run()) == data
    assert bytes(seen) == data
    assert [e.size for e in recorded] == [len(data[i:i + segment_size]) for i in range(0, len(data), segment_size)]
    assert len(blobs.blobs) == len(recorded), "one Location per segment, none for an empty body"
    assert finals == [e.size < segment_size for e in recorded], "only a short tail is known to be the last"


class SlowBlobs(MemoryBlobs):
    """Puts that wait until released, as a slow access node does."""

    def __init__(self) -> None:
        super().__init__()
        self.putting, self.release = asyncio.Event(), asyncio.Event()

    async def put(self, data: memoryview) -> str:
        self.putting.set()
        await self.release.wait()
        return await super().put(data)


def test_a_put_cancelled_midway_still_records_the_segment_being_stored() -> None:
    """A client that goes away cancels the request's task: the blob being written is written all the same, and
    recorded, else nothing would ever delete it."""
    recorded: list[Extent] = []

    async def record(extent: Extent, final: bool) -> None:
        recorded.append(extent)

    async def run() -> None:
        blobs = SlowBlobs()
        data = bytes(range(256)) * 40
        writing = asyncio.create_task(write_object(cast(AsyncClient, blobs), pieces(data, [3000]), 4096, record))
        await blobs.putting.wait()
        writing.cancel()
        for _ in range(10):  # the cancellation reaches write_object
            await asyncio.sleep(0)
        assert not writing.done(), "the cancelled PUT waits for the segment being stored"
        blobs.release.set()
        with pytest.raises(asyncio.CancelledError):
            await writing
        assert [e.location for e in recorded] == list(blobs.blobs)
        assert recorded and blobs.blobs[recorded[0].location] == data[:4096]

    asyncio.run(run())
