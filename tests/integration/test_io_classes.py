"""I/O classes on a real blobnode: a flood of background reads is held to the disk's background rate while
user reads keep their latency. These are the blobnode's own background lane (background writes, deletes and
compaction, and background reads where the background reader is off or not up yet): its reader is off here;
tests/integration/test_background_reader.py has the reader's."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time

import httpx

from blobstore_server.libs.proto.blobnode import IOClass
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import BadRequest
from blobstore_server.services.blobnode.client import BlobnodeClient
from tests.support.damage import lose_shard
from tests.support.processes import BlobnodeFactory

RATE_MIB = 8
BIG, SMALL = 1 << 20, 16 << 10


def p99(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.99) - 1]


def test_background_flood_is_capped_and_user_reads_keep_their_latency(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory(disks=1, background_mb_per_sec=RATE_MIB, background_concurrency=2,
                          background_reader=False)
    vuid = Vuid.make(1, 0, 1)
    rng = random.Random(1)

    async def scenario() -> None:
        async with BlobnodeClient() as client:
            await client.create_chunk(bn.url, 1, vuid)
            for bid in range(1, 9):
                await client.put_shard(bn.url, 1, vuid, bid, rng.randbytes(BIG))
            for bid in range(100, 120):
                await client.put_shard(bn.url, 1, vuid, bid, rng.randbytes(SMALL))

            async def user_reads(seconds: float) -> list[float]:
                latencies: list[float] = []
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    began = time.perf_counter()
                    await client.get_shard(bn.url, 1, vuid, rng.randrange(100, 120))
                    latencies.append(time.perf_counter() - began)
                return latencies

            moved = 0

            async def background_reads(until: float) -> None:
                nonlocal moved
                while time.monotonic() < until:
                    data = await client.get_shard(bn.url, 1, vuid, rng.randrange(1, 9), io_class=IOClass.BACKGROUND)
                    moved += len(data)

            baseline = await user_reads(2.0)
            began = time.monotonic()
            flood = [asyncio.create_task(background_reads(began + 3.0)) for _ in range(8)]
            during = await user_reads(3.0)
            await asyncio.gather(*flood)
            elapsed = time.monotonic() - began
            # The rate plus its quarter-second burst plus the operations already admitted when time ran out.
            assert moved <= (RATE_MIB * elapsed + RATE_MIB / 4 + 2) * BIG, moved / elapsed / BIG
            assert moved >= RATE_MIB * BIG  # and it was not starved either
            assert p99(during) <= max(1.5 * p99(baseline), p99(baseline) + 0.02), (p99(baseline), p99(during))

            metrics = httpx.get(f"{bn.url}/metrics").text
            counted = next(x for x in metrics.splitlines() if x.startswith("blobstore_blobnode_disk_background_bytes"))
            assert float(counted.split()[-1]) >= moved
            try:
                await client.http.read(f"{bn.url}/shard/get", params={"disk_id": 1, "vuid": vuid, "bid": 1,
                                                                       "io_class": "bulk"})
                raise AssertionError("an unknown I/O class was accepted")
            except BadRequest as exc:
                assert "io_class" in str(exc)

    asyncio.run(scenario())


def test_compaction_is_charged_against_the_background_rate(blobnode_factory: BlobnodeFactory) -> None:
    """A compaction rewrites every live byte of its chunk: read and written, they count against the disk's
    background rate, so the background work after it waits them off."""
    bn = blobnode_factory(disks=1, background_mb_per_sec=RATE_MIB, background_concurrency=2,
                          background_reader=False)
    vuid = Vuid.make(2, 0, 1)
    rng = random.Random(2)

    def charged() -> float:
        metrics = httpx.get(f"{bn.url}/metrics").text
        return float(next(x for x in metrics.splitlines()
                          if x.startswith("blobstore_blobnode_disk_background_bytes")).split()[-1])

    async def scenario() -> None:
        async with BlobnodeClient() as client:
            await client.create_chunk(bn.url, 1, vuid)
            for bid in range(1, 9):
                await client.put_shard(bn.url, 1, vuid, bid, rng.randbytes(BIG))
            for bid in range(1, 5):
                await lose_shard(client, Unit(vuid=vuid, disk_id=1, host=bn.url), bid)
            before = charged()
            await client.compact_chunk(bn.url, 1, vuid)
            assert charged() - before >= 2 * 4 * BIG  # four live shards read and written
            began = time.monotonic()
            await client.get_shard(bn.url, 1, vuid, 5, io_class=IOClass.BACKGROUND)
            # 8 MiB of debt at 8 MiB/s, less the quarter-second burst
            assert time.monotonic() - began >= 0.5

    asyncio.run(scenario())


def background_rate(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    return float(next(x for x in metrics.splitlines()
                      if x.startswith("blobstore_blobnode_background_rate_bytes")).split()[-1]) / (1 << 20)


def test_background_runs_at_its_ceiling_without_users_and_yields_when_they_starve(
        blobnode_factory: BlobnodeFactory) -> None:
    """No user request: a background flood goes well past the floor. Users served while the CPU is starved
    (busy processes, a real contention): the rate falls to the floor, and comes back up once they are gone."""
    bn = blobnode_factory(disks=1, background_mb_per_sec=64, background_min_mb_per_sec=1, background_concurrency=2,
                          background_reader=False)
    vuid = Vuid.make(3, 0, 1)
    rng = random.Random(3)

    async def scenario() -> None:
        async with BlobnodeClient() as client:
            await client.create_chunk(bn.url, 1, vuid)
            for bid in range(1, 9):
                await client.put_shard(bn.url, 1, vuid, bid, rng.randbytes(BIG))
            await client.put_shard(bn.url, 1, vuid, 100, rng.randbytes(SMALL))
            moved = 0

            async def background_reads(until: float) -> None:
                nonlocal moved
                while time.monotonic() < until:
                    moved += len(await client.get_shard(bn.url, 1, vuid, rng.randrange(1, 9),
                                                        io_class=IOClass.BACKGROUND))

            began = time.monotonic()
            flood = [asyncio.create_task(background_reads(began + 4.0)) for _ in range(4)]
            await asyncio.sleep(2.0)  # from the floor, doubling every quarter second
            assert await asyncio.to_thread(background_rate, bn.url) == 64
            halfway, moved_then = time.monotonic(), moved
            await asyncio.gather(*flood)
            idle_rate = (moved - moved_then) / (time.monotonic() - halfway) / BIG
            assert idle_rate >= 8, idle_rate  # eight times the floor: the ceiling applies

            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(6)]
            try:
                flood = [asyncio.create_task(background_reads(time.monotonic() + 4.0)) for _ in range(4)]
                lowest = float("inf")
                deadline = time.monotonic() + 4.0
                while time.monotonic() < deadline:
                    await client.get_shard(bn.url, 1, vuid, 100)  # a user, served late
                    lowest = min(lowest, await asyncio.to_thread(background_rate, bn.url))
                    await asyncio.sleep(0.02)
                await asyncio.gather(*flood)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
            assert lowest <= 2, lowest  # halved down to (about) the floor
            began = time.monotonic()
            await asyncio.gather(*(background_reads(began + 2.0) for _ in range(4)))
            assert await asyncio.to_thread(background_rate, bn.url) >= 32  # no users: back up

    asyncio.run(scenario())
