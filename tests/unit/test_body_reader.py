"""Access cuts a PUT's streamed body into blob-sized pieces: exact bytes across any chunking, and a body shorter or
longer than its Content-Length refused."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from blobstore_server.libs.rpc.errors import LengthMismatch
from blobstore_server.services.access.objects import BodyReader


async def _chunks(data: bytes, sizes: list[int]) -> AsyncIterator[bytes]:
    start = 0
    for size in sizes:
        yield data[start:start + size]
        start += size


@pytest.mark.parametrize("seed", range(20))
def test_pieces_are_the_bodys_bytes_whatever_the_chunks(seed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(1, 300_000))
    sizes, left = [], len(data)
    while left:
        sizes.append(min(left, rng.choice([1, 7, 4096, 65536, 100_000])))
        left -= sizes[-1]
    blob = rng.choice([1, 1000, 65536, 131072])

    async def cut() -> list[bytes]:
        reader = BodyReader(_chunks(data, sizes), len(data))
        pieces = [await reader.read(min(blob, len(data) - start)) for start in range(0, len(data), blob)]
        await reader.finish()
        return pieces

    pieces = asyncio.run(cut())
    assert all(type(piece) is bytes for piece in pieces)  # immutable: the codec shares it without a copy
    assert b"".join(pieces) == data and all(len(p) == blob for p in pieces[:-1])


def test_a_body_shorter_or_longer_than_declared_is_refused() -> None:
    async def read(data: bytes, declared: int, n: int) -> None:
        reader = BodyReader(_chunks(data, [3] * (len(data) // 3 + 1)), declared)
        await reader.read(n)
        await reader.finish()

    with pytest.raises(LengthMismatch, match="ended after 10 bytes"):
        asyncio.run(read(b"x" * 10, 20, 20))
    with pytest.raises(LengthMismatch, match="longer than its Content-Length"):
        asyncio.run(read(b"x" * 30, 20, 20))
