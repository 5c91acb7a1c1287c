"""An S3 object's bytes to and from access, through the project's async SDK, in constant memory.

A PUT body is cut into segments, each stored as one Location (the SDK cuts it into blobs): access needs a segment's
length up front, so a segment is held whole, and the next one is read from the client while the previous one is
being written (at most two held). Each segment is reported to `stored` as soon as it is stored, before the next
one is: the gateway notes it in the PUT's intent, so a crash leaves no blob that nothing refers to. A segment
shorter than `segment_size` is known to be the last when it is cut (`final`): the gateway holds it for the commit,
which records it (one write for a small object).

A GET reads only the extents its range overlaps, each with one ranged read, passing the bytes on as received.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from blobstore import AsyncClient
from blobstore_server.services.s3.namespace.records import Extent, Manifest

SEGMENT_SIZE = 8 << 20  # the gateway's default: bytes of a PUT stored as one Location

Stored = Callable[[Extent, bool], Awaitable[None]]  # (extent, final)
OnBytes = Callable[[memoryview], None]


async def _segments(body: AsyncIterator[bytes | memoryview], segment_size: int,
                    on_bytes: OnBytes | None) -> AsyncGenerator[memoryview, None]:
    """The body in segments of `segment_size` bytes, the last one shorter (none for an empty body); each in a
    buffer of its own, which the caller may hold while the next one is read. A buffer grows with what arrives: a
    10 KiB object does not zero a whole segment's."""
    buffer = bytearray()
    async for piece in body:
        view = memoryview(piece).cast("B")
        if on_bytes is not None:
            on_bytes(view)
        while view:
            taken = min(len(view), segment_size - len(buffer))
            buffer += view[:taken]
            view = view[taken:]
            if len(buffer) == segment_size:
                yield memoryview(buffer)
                buffer = bytearray()
    if buffer:
        yield memoryview(buffer)


async def _store(client: AsyncClient, segment: memoryview, offset: int, stored: Stored, final: bool) -> Extent:
    extent = Extent(offset, len(segment), await client.put(segment))
    await stored(extent, final)
    return extent


async def write_object(client: AsyncClient, body: AsyncIterator[bytes | memoryview], segment_size: int,
                       stored: Stored, on_bytes: OnBytes | None = None) -> Manifest:
    """Store `body` as `segment_size`-byte Locations and return its manifest (empty for an empty body).

    `stored` gets each extent, in order, once its Location is stored, and whether it is the body's short last one;
    `on_bytes` sees every byte of the body as it is read (for digests). If reading the body fails (the client went
    away, a digest did not match), the segment being stored is still stored and reported, then the error
    propagates: the caller gives the intent up."""
    if segment_size <= 0:
        raise ValueError(f"segment_size {segment_size} is not positive")
    extents: list[Extent] = []
    storing: asyncio.Task[Extent] | None = None
    offset = 0
    try:
        async with aclosing(_segments(body, segment_size, on_bytes)) as segments:
            async for segment in segments:
                if storing is not None:
                    extents.append(await asyncio.shield(storing))
                final = len(segment) < segment_size
                storing = asyncio.create_task(_store(client, segment, offset, stored, final))
                offset += len(segment)
        if storing is not None:
            extents.append(await asyncio.shield(storing))
    except BaseException:
        if storing is not None:
            await _settle(storing)
        raise
    return tuple(extents)


async def _settle(storing: asyncio.Task[Extent]) -> None:
    """Let a segment's store finish (and be recorded) though the PUT failed or was cancelled: stopped halfway, its
    blob could be written and never recorded. Its own failure is not raised: the error that stopped the PUT is."""
    await asyncio.wait([storing])
    if not storing.cancelled():
        storing.exception()  # retrieved, so asyncio does not report it as lost


def extents_for(manifest: Manifest, first: int, last: int) -> list[tuple[str, int, int]]:
    """The reads (location, offset in its blob, size) that give bytes [first, last] of the object, in order.

    Inclusive, as an HTTP range: 0 <= first <= last < size; `last = first - 1` is an empty range (an empty object
    read whole). The manifest's extents are contiguous from 0 in order (write_object's, or Complete's joined ones)."""
    size = manifest[-1].offset + manifest[-1].size if manifest else 0
    if not 0 <= first <= last + 1 <= size:
        raise ValueError(f"bytes {first}-{last} are not a range of an object of {size} bytes")
    reads: list[tuple[str, int, int]] = []
    index = max(0, bisect.bisect_right(manifest, first, key=lambda e: e.offset) - 1)
    while index < len(manifest) and manifest[index].offset <= last:
        extent = manifest[index]
        start, end = max(first, extent.offset), min(last, extent.offset + extent.size - 1)
        if start <= end:
            reads.append((extent.location, start - extent.offset, end - start + 1))
        index += 1
    return reads


async def read_object(client: AsyncClient, manifest: Manifest, first: int, last: int) -> AsyncIterator[bytes]:
    """Bytes [first, last] of the object (see `extents_for`), as they come off the network."""
    for location, offset, size in extents_for(manifest, first, last):
        async for piece in client.get_stream(location, offset, size, chunk_size=None):
            yield piece
