"""S3 objects' bytes through the async SDK on a real cluster: bodies cut into segment Locations and read back whole
and by ranges across extents, every stored segment recorded in order (also when the body fails midway), a 200 MiB
body in constant memory at the SDK's own rate, and the reaper deleting through access what an overwrite or a
given-up PUT left in a real SQLite namespace's GC outbox."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from blobstore import AsyncClient, BlobstoreError, NotFound, Unavailable
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.config import S3Config
from blobstore_server.services.s3.namespace import Extent, ObjectRecord, open_sqlite
from blobstore_server.services.s3.reaper import reap_forever, reap_once, sweep_intents
from blobstore_server.services.s3.transfer import read_object, write_object
from tests.support.processes import LocalCluster
from tests.support.waiting import eventually

MiB = 1 << 20
SEGMENT = MiB
PIECE = 64 << 10  # what a request body arrives in
BIG = 200 * MiB
BIG_SEGMENT = 4 * MiB
PATTERN = random.Random(7).randbytes(MiB + 4099)  # a big body is this, repeated: no 200 MiB buffer in the test
DOUBLED = memoryview(PATTERN * 2)


@dataclass
class Recorder:
    """`stored` as the gateway passes it; here it only keeps what it saw."""

    extents: list[Extent] = field(default_factory=list)
    finals: list[bool] = field(default_factory=list)

    async def __call__(self, extent: Extent, final: bool) -> None:
        self.extents.append(extent)
        self.finals.append(final)


async def pieces_of(data: bytes, size: int = 100_003) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def pattern(size: int) -> Iterator[memoryview]:
    for start in range(0, size, PIECE):
        at = start % len(PATTERN)
        yield DOUBLED[at:at + min(PIECE, size - start)]


async def streamed(size: int, sample: Callable[..., None]) -> AsyncIterator[memoryview]:
    for piece in pattern(size):
        sample()
        yield piece


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The process's resident memory sampled as the bytes pass: its peak above where it stood before."""

    def __init__(self) -> None:
        self.before = self.peak = rss()

    def sample(self, *_: object) -> None:
        self.peak = max(self.peak, rss())

    @property
    def growth(self) -> int:
        return self.peak - self.before


async def ready(client: AsyncClient) -> None:
    """The first PUT of a fresh cluster waits for volumes to be created and leased."""

    async def put() -> str | None:
        try:
            return await client.put(b"ready")
        except BlobstoreError:
            return None

    await eventually(put, 30, "a first PUT")


async def read_all(client: AsyncClient, extents: tuple[Extent, ...], first: int, last: int) -> bytes:
    return b"".join([piece async for piece in read_object(client, extents, first, last)])


async def gone(client: AsyncClient, location: str) -> bool:
    try:
        await client.get(location)
    except NotFound:
        return True
    except Unavailable:  # a read that began before the delete breaks off once a later blob is marked
        return False
    return False


def test_reaper_deletes_what_an_overwrite_and_a_given_up_put_left(cluster_factory: Callable[..., LocalCluster],
                                                                   tmp_path: Path) -> None:
    cluster = cluster_factory(pipelines=True, clustermgrs=1, safe_delay=1.0)
    store = open_sqlite(tmp_path / "namespace.sqlite", gc_delay_ms=0)
    store.create_bucket("bucket", "alice")

    async def put(client: AsyncClient, key: bytes, data: bytes, commit: bool = True) -> tuple[Extent, ...]:
        intent = store.begin_intent(store.get_bucket("bucket"), key)
        backend = Backend(store, client, S3Config(access_hosts=[cluster.access[0].url]))
        md5 = hashlib.md5(usedforsecurity=False)
        manifest = await write_object(client, pieces_of(data), SEGMENT, backend.stored_into(intent), md5.update)
        if commit:
            record = ObjectRecord(key, len(data), md5.hexdigest(), store.clock(), manifest=manifest)
            await asyncio.to_thread(store.commit_object, "bucket", record, intent)
        return manifest

    async def check() -> None:
        async with AsyncClient(cluster.access[0].url) as client:
            await ready(client)
            old = await put(client, b"key", os.urandom(2 * SEGMENT + 10))
            new_data = os.urandom(SEGMENT + 5)
            new = await put(client, b"key", new_data)
            assert await reap_once(store, client) == len(old) == 3
            for extent in old:
                await eventually(partial(gone, client, extent.location), 10, f"{extent} to be deleted")
            manifest = (await asyncio.to_thread(store.get_object, "bucket", b"key")).manifest
            assert manifest == new and await read_all(client, manifest, 0, len(new_data) - 1) == new_data
            assert await reap_once(store, client) == 0, "the outbox rows of deleted Locations are gone"

            # a gateway that crashed before its commit (whole segments: each was recorded as soon as stored)
            abandoned = await put(client, b"crashed", os.urandom(2 * SEGMENT), commit=False)
            assert [await gone(client, e.location) for e in abandoned] == [False, False]
            token = old[0].location
            forged = Extent(0, 1, token[:-1] + ("A" if token[-1] != "A" else "B"))  # refused: kept for next round
            intent = store.begin_intent(store.get_bucket("bucket"), b"forged")
            await asyncio.to_thread(store.add_intent_extent, intent, forged)
            await asyncio.to_thread(store.abandon_intent, intent)
            reaping = asyncio.create_task(reap_forever(store, client, interval=0.1, intent_ttl_ms=0))
            try:
                for extent in abandoned:
                    await eventually(partial(gone, client, extent.location), 15, f"{extent} to be reaped")
            finally:
                reaping.cancel()
            assert await sweep_intents(store, 0) == 0, "the given-up PUT's intent was swept"
            assert [g.location for g in store.due_garbage(100)] == [forged.location]
            assert await read_all(client, manifest, 0, len(new_data) - 1) == new_data

    asyncio.run(check())
    store.close()


def test_bodies_come_back_whole_and_by_ranges_across_extents(shared_cluster: LocalCluster) -> None:
    sizes = [0, 1, SEGMENT, 3 * SEGMENT + 12345]

    async def check() -> None:
        async with AsyncClient(shared_cluster.access[0].url) as client:
            await ready(client)
            for size in sizes:
                data = os.urandom(size)
                recorder, seen = Recorder(), bytearray()
                manifest = await write_object(client, pieces_of(data), SEGMENT, recorder, seen.extend)
                assert list(manifest) == recorder.extents and bytes(seen) == data
                # a short last segment is known to be the last when it is cut: held for the commit to record
                assert recorder.finals == [e.size < SEGMENT for e in manifest]
                assert [e.size for e in manifest] == [len(data[at:at + SEGMENT]) for at in range(0, size, SEGMENT)]
                assert [e.offset for e in manifest] == list(range(0, size, SEGMENT))
                assert len({e.location for e in manifest}) == len(manifest)
                assert await read_all(client, manifest, 0, size - 1) == data
                ranges = [(0, 0), (size - 1, size - 1), (SEGMENT - 1, SEGMENT), (SEGMENT - 10, 2 * SEGMENT + 10),
                          (5, size - 1), (2 * SEGMENT, 3 * SEGMENT - 1)]
                for first, last in ranges:
                    if 0 <= first <= last < size:
                        assert await read_all(client, manifest, first, last) == data[first:last + 1], (first, last)

    asyncio.run(check())


@pytest.mark.parametrize("fails_at", [SEGMENT // 2, 2 * SEGMENT + SEGMENT // 2])
def test_a_body_that_fails_midway_reports_what_was_stored_and_raises(shared_cluster: LocalCluster,
                                                                      fails_at: int) -> None:
    data = os.urandom(fails_at)

    async def body() -> AsyncIterator[bytes]:
        async for piece in pieces_of(data):
            yield piece
        raise ConnectionResetError("the client went away")

    async def check() -> None:
        async with AsyncClient(shared_cluster.access[0].url) as client:
            await ready(client)
            recorder = Recorder()
            with pytest.raises(ConnectionResetError):
                await write_object(client, body(), SEGMENT, recorder)
            assert [e.offset for e in recorder.extents] == list(range(0, fails_at - SEGMENT + 1, SEGMENT))
            for extent in recorder.extents:  # stored whole: the intent names every blob the PUT wrote
                assert await client.get(extent.location) == data[extent.offset:extent.offset + extent.size]

    asyncio.run(check())


def test_a_200_mib_body_streams_in_constant_memory_at_the_sdks_rate(shared_cluster: LocalCluster) -> None:
    expected = 0
    for piece in pattern(BIG):
        expected = zlib.crc32(piece, expected)

    async def check() -> dict[str, float]:
        async with AsyncClient(shared_cluster.access[0].url) as client:
            await ready(client)
            rates: dict[str, float] = {}
            memory = PeakRss()
            started = time.perf_counter()
            manifest = await write_object(client, streamed(BIG, memory.sample), BIG_SEGMENT, Recorder())
            rates["write_object"] = BIG / (time.perf_counter() - started)
            rates["write_object MiB"] = memory.growth / MiB
            assert len(manifest) == BIG // BIG_SEGMENT
            assert memory.growth < 48 * MiB, f"writing grew the process by {memory.growth / MiB:.0f} MiB"
            memory, crc = PeakRss(), 0
            started = time.perf_counter()
            async for piece in read_object(client, manifest, 0, BIG - 1):
                memory.sample()
                crc = zlib.crc32(piece, crc)
            rates["read_object"] = BIG / (time.perf_counter() - started)
            rates["read_object MiB"] = memory.growth / MiB
            assert crc == expected
            assert memory.growth < 48 * MiB, f"reading grew the process by {memory.growth / MiB:.0f} MiB"

            memory = PeakRss()
            started = time.perf_counter()
            location = await client.put(streamed(BIG, memory.sample), size=BIG)
            rates["sdk put"] = BIG / (time.perf_counter() - started)
            rates["sdk put MiB"] = memory.growth / MiB
            memory, crc = PeakRss(), 0
            started = time.perf_counter()
            async for piece in client.get_stream(location, chunk_size=None):
                memory.sample()
                crc = zlib.crc32(piece, crc)
            rates["sdk get"] = BIG / (time.perf_counter() - started)
            rates["sdk get MiB"] = memory.growth / MiB
            assert crc == expected
            return rates

    rates = asyncio.run(check())
    print(f"200 MiB in {BIG_SEGMENT // MiB} MiB segments: write_object {rates['write_object'] / MiB:.0f} MiB/s "
          f"vs SDK put {rates['sdk put'] / MiB:.0f} MiB/s ({rates['write_object'] / rates['sdk put']:.2f}x); "
          f"read_object {rates['read_object'] / MiB:.0f} MiB/s vs SDK get {rates['sdk get'] / MiB:.0f} MiB/s "
          f"({rates['read_object'] / rates['sdk get']:.2f}x); RSS growth MiB: " +
          ", ".join(f"{name[:-4]} {value:.0f}" for name, value in rates.items() if name.endswith(" MiB")))
