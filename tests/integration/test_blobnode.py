"""A real blobnode process on 127.0.0.1: shard round trips, corruption, fencing, bad input."""

from __future__ import annotations

import asyncio
import os
import random
import resource
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from isal.isal_zlib import crc32

from blobstore_server.libs.proto.blobnode import DiskStat, ShardPutBatchResult
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import errors
from blobstore_server.libs.rpc.client import HttpClient
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.blobnode.client import BlobnodeClient
from tests.support.damage import lose_shard
from tests.support.metrics import sample
from tests.support.processes import TEST_SECRET, BlobnodeFactory
from tests.support.tickets import as_tinker, minter

T = TypeVar("T")
VUID = Vuid.make(7, 2, 1)


def tinkers(host: str, bid: int) -> dict[str, Any]:
    """The delete ticket and intent tinker sends for the shard `bid` of VUID on disk 1 of `host` (to mark it, to
    delete it)."""
    return as_tinker(host, 1, VUID, bid)


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def payload(bid: int, size: int) -> bytes:
    return random.Random(bid).randbytes(size)


async def with_client(fn: Any) -> Any:
    async with BlobnodeClient() as client:
        return await fn(client)


def chunk_path(node_dir: Path, disk_index: int, chunk_id: str) -> Path:
    return node_dir / f"disk{disk_index}" / "data" / chunk_id


def test_put_get_ranges_stat_and_list(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()

    async def scenario(c: BlobnodeClient) -> None:
        await c.create_chunk(bn.url, 1, VUID)
        sizes = {1: 0, 2: 1, 3: 65535, 4: 65536, 5: 65537, 6: 4 << 20}
        for bid, size in sizes.items():
            crc = await c.put_shard(bn.url, 1, VUID, bid, payload(bid, size))
            assert crc == (await c.shard_stat(bn.url, 1, VUID, bid)).crc
        for bid, size in sizes.items():
            assert await c.get_shard(bn.url, 1, VUID, bid) == payload(bid, size)
        rng = random.Random(1)
        for _ in range(30):
            start = rng.randrange(0, 4 << 20)
            length = rng.randrange(0, (4 << 20) - start + 1)
            got = await c.get_shard(bn.url, 1, VUID, 6, start, length)
            assert got == payload(6, 4 << 20)[start:start + length]
        listed = await c.list_shards(bn.url, 1, VUID, start_bid=3, count=2)
        assert [s.bid for s in listed] == [3, 4]
        with pytest.raises(errors.RangeNotSatisfiable):
            await c.get_shard(bn.url, 1, VUID, 3, 65000, 1000)
        with pytest.raises(errors.ShardNotFound):
            await c.get_shard(bn.url, 1, VUID, 99)

    run(with_client(scenario))


def test_corrupted_block_is_refused_never_served(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()
    size = 300_000  # five 64 KiB blocks

    async def scenario(c: BlobnodeClient) -> None:
        record = await c.create_chunk(bn.url, 1, VUID)
        await c.put_shard(bn.url, 1, VUID, 10, payload(10, size))
        meta = await c.shard_stat(bn.url, 1, VUID, 10)
        path = chunk_path(bn.workdir, 0, record.chunk_id)
        # Third block: shard header (32) + two (crc + 64 KiB) blocks + its own crc, then 100 bytes in.
        position = meta.offset + 32 + 2 * (4 + 65536) + 4 + 100
        with open(path, "r+b") as f:
            f.seek(position)
            byte = f.read(1)
            f.seek(position)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(errors.ShardCorrupted):
            await c.get_shard(bn.url, 1, VUID, 10)
        with pytest.raises(errors.ShardCorrupted):
            await c.get_shard(bn.url, 1, VUID, 10, 2 * 65536 + 50, 10)
        assert await c.get_shard(bn.url, 1, VUID, 10, 0, 65536) == payload(10, size)[:65536]

    run(with_client(scenario))


def test_epoch_fencing_readonly_and_release(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()
    stale = Vuid.make(7, 2, 0)
    newer = Vuid.make(7, 2, 2)

    async def scenario(c: BlobnodeClient) -> None:
        await c.create_chunk(bn.url, 1, VUID)
        await c.put_shard(bn.url, 1, VUID, 1, b"abc")
        with pytest.raises(errors.StaleEpoch):
            await c.put_shard(bn.url, 1, stale, 2, b"x")
        with pytest.raises(errors.StaleEpoch):
            await c.get_shard(bn.url, 1, stale, 1)
        with pytest.raises(errors.ChunkNotFound):
            await c.put_shard(bn.url, 1, newer, 2, b"x")
        with pytest.raises(errors.ChunkExists):
            await c.create_chunk(bn.url, 1, newer)
        await c.create_chunk(bn.url, 1, VUID)  # retried create is harmless
        await c.set_chunk_readonly(bn.url, 1, VUID)
        with pytest.raises(errors.ChunkReadonly):
            await c.put_shard(bn.url, 1, VUID, 2, b"x")
        assert await c.get_shard(bn.url, 1, VUID, 1) == b"abc"
        await c.set_chunk_readonly(bn.url, 1, VUID, readonly=False)
        await c.put_shard(bn.url, 1, VUID, 2, b"x")
        await c.release_chunk(bn.url, 1, VUID, ticket=minter(TEST_SECRET, Kind.RELEASE).mint(bn.url, 1, VUID))
        with pytest.raises(errors.ChunkNotFound):
            await c.get_shard(bn.url, 1, VUID, 1)
        assert await c.list_chunks(bn.url, 1) == []
        await c.create_chunk(bn.url, 1, newer)  # the unit can move back after release
        assert (await c.list_chunks(bn.url, 1))[0].vuid == newer

    run(with_client(scenario))


def test_duplicate_puts_and_length_mismatch(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()

    async def scenario(c: BlobnodeClient) -> None:
        await c.create_chunk(bn.url, 1, VUID)
        crc = await c.put_shard(bn.url, 1, VUID, 5, b"hello")
        assert await c.put_shard(bn.url, 1, VUID, 5, b"hello") == crc
        with pytest.raises(errors.ShardExists):
            await c.put_shard(bn.url, 1, VUID, 5, b"HELLO")
        params = {"disk_id": 1, "vuid": VUID, "bid": 6}
        for declared, body in ((10, b"short"), (3, b"longer body")):
            with pytest.raises(errors.LengthMismatch):
                await c.http.request("PUT", f"{bn.url}/shard/put", params={**params, "size": declared,
                                                                            "crc": crc32(body)}, data=body)
        with pytest.raises(errors.ShardNotFound):
            await c.shard_stat(bn.url, 1, VUID, 6)
        with pytest.raises(errors.TooLarge):
            await c.http.request("PUT", f"{bn.url}/shard/put", params={**params, "size": 1 << 40, "crc": 0}, data=b"")
        with pytest.raises(errors.BadRequest, match="bid"):
            await c.http.request("PUT", f"{bn.url}/shard/put", params={"disk_id": 1, "vuid": VUID, "size": 1,
                                                                        "crc": crc32(b"x")}, data=b"x")
        with pytest.raises(errors.DiskNotFound):
            await c.put_shard(bn.url, 9, VUID, 7, b"x")
        with pytest.raises(errors.BadRequest):
            await c.http.request("POST", f"{bn.url}/chunk/create", data=b"{not json")
        with pytest.raises(errors.BadRequest, match="vuid"):
            await c.http.request("POST", f"{bn.url}/chunk/create", json={"disk_id": 1})
        assert await c.get_shard(bn.url, 1, VUID, 5) == b"hello"

    run(with_client(scenario))


def test_puts_to_one_node_ride_together_each_with_its_own_outcome(blobnode_factory: BlobnodeFactory) -> None:
    """Concurrent small puts through a coalescing client go in /shard/put_batch requests; each caller gets its
    shard's CRC or the error it alone met, and a refused shard leaves nothing behind."""
    bn = blobnode_factory()

    async def scenario(c: BlobnodeClient) -> None:
        await c.create_chunk(bn.url, 1, VUID)
        await c.create_chunk(bn.url, 2, VUID)
        await c.put_shard(bn.url, 1, VUID, 1000, b"taken")
        calls = [c.put_shard(bn.url, 1 + bid % 2, VUID, bid, payload(bid, 4096)) for bid in range(1, 41)]
        calls.append(c.put_shard(bn.url, 9, VUID, 41, b"no such disk"))
        calls.append(c.put_shard(bn.url, 1, VUID, 1000, b"other bytes"))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert results[:40] == [crc32(payload(bid, 4096)) for bid in range(1, 41)]
        assert isinstance(results[40], errors.DiskNotFound), results[40]
        assert isinstance(results[41], errors.ShardExists), results[41]
        for bid in range(1, 41):
            assert await c.get_shard(bn.url, 1 + bid % 2, VUID, bid) == payload(bid, 4096)
        assert await c.get_shard(bn.url, 1, VUID, 1000) == b"taken"

    async def coalescing() -> None:
        async with BlobnodeClient(in_flight=1) as client:
            await scenario(client)

    run(coalescing())
    batches = sample(bn.url, "blobstore_http_requests_total", {"route": "/shard/put_batch", "status": "200"})
    assert batches >= 1


def test_reads_from_one_node_ride_together_each_with_its_own_outcome(blobnode_factory: BlobnodeFactory) -> None:
    """Concurrent small reads through a coalescing client go in /shard/get_batch requests; each caller gets its
    range's bytes or the error it alone met."""
    bn = blobnode_factory()

    async def scenario(c: BlobnodeClient) -> None:
        for disk_id in (1, 2):
            await c.create_chunk(bn.url, disk_id, VUID)
        for bid in range(1, 31):
            await c.put_shard(bn.url, 1 + bid % 2, VUID, bid, payload(bid, 4096))
        ranges = [(1 + bid % 2, bid, bid * 7, 1000 + bid) for bid in range(1, 31)]
        calls = [c.get_shard(bn.url, disk_id, VUID, bid, offset, size) for disk_id, bid, offset, size in ranges]
        calls.append(c.get_shard(bn.url, 1, VUID, 99, 0, 10))  # no such shard
        calls.append(c.get_shard(bn.url, 1, VUID, 2, 4000, 200))  # past its end
        calls.append(c.get_shard(bn.url, 9, VUID, 2, 0, 10))  # no such disk
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [bytes(r) for r in results[:30] if not isinstance(r, BaseException)] == [
            payload(bid, 4096)[offset:offset + size] for _, bid, offset, size in ranges]
        assert isinstance(results[30], errors.ShardNotFound), results[30]
        assert isinstance(results[31], errors.RangeNotSatisfiable), results[31]
        assert isinstance(results[32], errors.DiskNotFound), results[32]

    async def coalescing() -> None:
        async with BlobnodeClient(in_flight=1) as client:
            await scenario(client)

    run(coalescing())
    batches = sample(bn.url, "blobstore_http_requests_total", {"route": "/shard/get_batch", "status": "200"})
    assert batches >= 1


def test_a_call_queued_behind_a_stalled_one_gives_up_within_its_own_timeout(blobnode_factory: BlobnodeFactory) -> None:
    """A blobnode that stops answering (SIGSTOP, alive like a stuck disk): puts and reads queued behind the one on
    its way fail within their own timeout, not after that one's timeout plus their batch's."""
    bn = blobnode_factory()

    async def scenario() -> None:
        async with BlobnodeClient(in_flight=1) as c:
            await c.create_chunk(bn.url, 1, VUID)
            await c.put_shard(bn.url, 1, VUID, 1, b"stored before")
            os.kill(bn.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                calls = [c.put_shard(bn.url, 1, VUID, bid, b"x", timeout=1.0) for bid in range(2, 5)]
                calls += [c.get_shard(bn.url, 1, VUID, 1, 0, 5, timeout=1.0) for _ in range(3)]
                results = await asyncio.gather(*calls, return_exceptions=True)
                took = time.monotonic() - started
            finally:
                os.kill(bn.pid, signal.SIGCONT)
            assert all(isinstance(r, errors.Unreachable) for r in results), results
            assert took < 1.8, took
            assert await c.get_shard(bn.url, 1, VUID, 1) == b"stored before"

    run(scenario())


def test_a_batch_refuses_bad_input_whole_and_a_bad_shard_alone(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()
    url = f"{bn.url}/shard/put_batch"

    def query(bids: list[int], bodies: list[bytes], **other: str) -> dict[str, str | int]:
        listed = ".".join
        return {"disk_id": listed("1" for _ in bids), "vuid": listed(str(int(VUID)) for _ in bids),
                "bid": listed(map(str, bids)), "size": listed(str(len(b)) for b in bodies),
                "crc": listed(str(crc32(b)) for b in bodies), **other}

    async def scenario(c: BlobnodeClient) -> None:
        await c.create_chunk(bn.url, 1, VUID)
        good = [b"first", b"second"]
        refused = {  # each refused whole, with a reason
            "lists 1 values for 2": {**query([1, 2], good), "vuid": str(int(VUID))},
            "user shards only": query([1, 2], good, io_class="background"),
            "integers": {**query([1, 2], good), "bid": "1.x"},
            "1 to 64 shards": query(list(range(1, 66)), [b"x"] * 65),
            "exceeds the limit": {**query([1, 2], good), "size": f"5.{1 << 40}"},
        }
        for reason, params in refused.items():
            body = b"x" * 65 if "64" in reason else b"".join(good)
            with pytest.raises(errors.RpcError, match=reason) as caught:
                await c.http.request("PUT", url, params=params, data=body)
            assert caught.value.status in (400, 413)
        with pytest.raises(errors.LengthMismatch):
            await c.http.request("PUT", url, params=query([1, 2], good), data=b"too short")
        reads = {"disk_id": "1.1", "vuid": f"{int(VUID)}.{int(VUID)}", "bid": "1.2", "offset": "0.0"}
        for reason, params in {"at most": {**reads, "size": f"1.{1 << 30}"},
                               "lists 1 values for 2": {**reads, "size": "1"},
                               "user shards only": {**reads, "size": "1.1", "io_class": "background"}}.items():
            with pytest.raises(errors.BadRequest, match=reason):
                await c.http.request("GET", f"{bn.url}/shard/get_batch", params=params)
        # bytes that do not match their signed CRC: that shard alone is refused
        answer = await c.http.request("PUT", url, params=query([1, 2], good), data=b"first" + b"SECOND")
        outcomes = ShardPutBatchResult.model_validate_json(bytes(answer)).shards
        assert outcomes[0].stored is not None and outcomes[0].stored.crc == crc32(b"first")
        assert outcomes[1].failure is not None and outcomes[1].failure.status == 400
        assert "CRC" in outcomes[1].failure.error
        assert await c.get_shard(bn.url, 1, VUID, 1) == b"first"
        with pytest.raises(errors.ShardNotFound):
            await c.shard_stat(bn.url, 1, VUID, 2)

    run(with_client(scenario))


def test_mark_delete_delete_punches_hole_and_compaction(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()
    size = 1 << 20

    async def scenario(c: BlobnodeClient) -> None:
        record = await c.create_chunk(bn.url, 1, VUID)
        for bid in range(1, 9):
            await c.put_shard(bn.url, 1, VUID, bid, payload(bid, size))
        await c.mark_delete_shard(bn.url, 1, VUID, 1, **tinkers(bn.url, 1))
        with pytest.raises(errors.ShardDeleted):
            await c.get_shard(bn.url, 1, VUID, 1)
        await c.unmark_delete_shard(bn.url, 1, VUID, 1)
        assert await c.get_shard(bn.url, 1, VUID, 1) == payload(1, size)
        path = chunk_path(bn.workdir, 0, record.chunk_id)
        blocks_before = os.stat(path).st_blocks
        await c.mark_delete_shard(bn.url, 1, VUID, 1, **tinkers(bn.url, 1))
        with pytest.raises(errors.Conflict, match="delete_hold"):  # a user delete waits the hold (4 h default)
            await c.delete_shard(bn.url, 1, VUID, 1, **tinkers(bn.url, 1))
        for bid in (1, 2, 3, 4):  # a repair's discard (of a rotten shard) does not
            await lose_shard(c, Unit(vuid=VUID, disk_id=1, host=bn.url), bid)
        assert os.stat(path).st_blocks <= blocks_before - 4 * size // 512 + 32  # ext4 extent metadata slack
        with pytest.raises(errors.ShardNotFound):
            await c.get_shard(bn.url, 1, VUID, 2)
        compacted = await c.compact_chunk(bn.url, 1, VUID)
        assert compacted.chunk_id != record.chunk_id
        assert not path.exists()
        for bid in range(5, 9):
            assert await c.get_shard(bn.url, 1, VUID, bid) == payload(bid, size)
        assert [s.bid for s in await c.list_shards(bn.url, 1, VUID)] == [5, 6, 7, 8]
        await c.put_shard(bn.url, 1, VUID, 9, b"after compaction")
        assert await c.get_shard(bn.url, 1, VUID, 9) == b"after compaction"

    run(with_client(scenario))


def test_a_mark_late_in_a_second_still_holds_its_delete_the_whole_hold(blobnode_factory: BlobnodeFactory) -> None:
    """The mark's time is kept in whole seconds; a mark at x.95 s must still hold a 1 s delete_hold past x+1.95
    (truncated, it let a delete through 0.1 s after the mark), and the refusal says when to come back."""
    bn = blobnode_factory(delete_hold=1.0)

    async def scenario(c: BlobnodeClient) -> None:
        await c.create_chunk(bn.url, 1, VUID)
        await c.put_shard(bn.url, 1, VUID, 1, b"doomed")
        await asyncio.sleep(1.95 - time.time() % 1.0)  # to the last twentieth of a second
        await c.mark_delete_shard(bn.url, 1, VUID, 1, **tinkers(bn.url, 1))
        marked = time.monotonic()
        await asyncio.sleep(0.1)
        with pytest.raises(errors.ShardHeld, match="delete_hold") as held:
            await c.delete_shard(bn.url, 1, VUID, 1, **tinkers(bn.url, 1))
        assert 0.8 <= float(held.value.details["retry_after"]) <= 2.0, held.value.details
        await asyncio.sleep(max(0.0, marked + 2.1 - time.monotonic()))
        await c.delete_shard(bn.url, 1, VUID, 1, **tinkers(bn.url, 1))
        with pytest.raises(errors.ShardNotFound):
            await c.get_shard(bn.url, 1, VUID, 1)

    run(with_client(scenario))


def test_restart_keeps_chunks_and_shards_on_every_disk(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory(disks=3)

    async def write(c: BlobnodeClient) -> None:
        for disk_id in (1, 2, 3):
            await c.create_chunk(bn.url, disk_id, Vuid.make(disk_id, 0, 1))
            await c.put_shard(bn.url, disk_id, Vuid.make(disk_id, 0, 1), 42, payload(disk_id, 5000))

    async def read(c: BlobnodeClient) -> None:
        stat = await c.stat(bn.url)
        assert [d.disk_id for d in stat.disks] == [1, 2, 3]
        for disk_id in (1, 2, 3):
            assert await c.get_shard(bn.url, disk_id, Vuid.make(disk_id, 0, 1), 42) == payload(disk_id, 5000)

    run(with_client(write))
    bn.stop()
    bn.start()
    run(with_client(read))


def test_disk_of_another_cluster_is_refused(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()
    bn.stop()
    bn.config["cluster_id"] = 2
    with pytest.raises(RuntimeError, match="belongs to cluster 1"):
        bn.start(timeout=10)


def test_kill9_during_put_stream_loses_no_acknowledged_shard(blobnode_factory: BlobnodeFactory) -> None:
    """Small shards (written from the event loop, synced in the disk's groups) and large ones (written on a
    disk thread), into two chunks of one disk that share its group commit."""
    bn = blobnode_factory(disks=1)
    vuids = (VUID, Vuid.make(Vuid(VUID).vid() + 1, 0, 1))
    acked: list[int] = []

    def size_of(bid: int) -> int:
        return 70_000 + bid if bid % 3 == 0 else 1_000 + bid

    async def stream(c: BlobnodeClient) -> None:
        for vuid in vuids:
            await c.create_chunk(bn.url, 1, vuid)

        async def writer(first: int) -> None:
            bid = first
            while True:
                try:
                    await c.put_shard(bn.url, 1, vuids[bid % 2], bid, payload(bid, size_of(bid)))
                except errors.RpcError:
                    return
                acked.append(bid)
                bid += 8
                if len(acked) == 300:
                    bn.kill9()

        await asyncio.gather(*(writer(first) for first in range(1, 9)))

    run(with_client(stream))
    assert len(acked) >= 300
    bn.start()

    async def verify(c: BlobnodeClient) -> None:
        for bid in acked:
            assert await c.get_shard(bn.url, 1, vuids[bid % 2], bid) == payload(bid, size_of(bid))
        await c.put_shard(bn.url, 1, VUID, 10**9, b"after restart")

    run(with_client(verify))


def test_health_and_stats_shapes(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory()

    async def scenario(c: BlobnodeClient) -> DiskStat:
        assert await c.health(bn.url)
        return await c.disk_stat(bn.url, 1)

    stat = run(with_client(scenario))
    assert stat.disk_id == 1 and stat.free > 0 and stat.chunks == 0


def test_http_client_reports_dead_node_as_unavailable() -> None:
    async def scenario() -> None:
        async with HttpClient(timeout=2) as http:
            with pytest.raises(errors.Unavailable):
                await http.request("GET", "http://127.0.0.1:1/health")

    run(scenario())


def _soft_open_files(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files"))
    return int(line.split()[3])


def _io_errors(url: str) -> str:
    """The disk's line of the io_errors counter in the blobnode's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return next(line for line in text.splitlines() if line.startswith("blobstore_blobnode_disk_io_errors_total"))


def test_open_file_limits_are_lifted_and_running_out_of_them_is_no_disk_fault(
        blobnode_factory: BlobnodeFactory) -> None:
    """Every chunk file stays open. A blobnode lifts its soft open-file limit to the hard one, so 300 chunks under
    a soft limit of 256 each take a shard (without the lift chunk creation fails with EMFILE near 200). Under a
    hard limit it cannot lift, running out is a 503 that counts nothing against the disk (without that, three of
    them had the disk reported broken and every unit on it rebuilt)."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("the hard open-file limit is too low to show the lift")
    lifted = blobnode_factory("lifted", disks=1, wait=False, under=("prlimit", "--nofile=256:", "--"))
    capped = blobnode_factory("capped", disks=1, wait=False, under=("prlimit", "--nofile=128:128", "--"))
    lifted.ready()
    capped.ready()
    assert _soft_open_files(lifted.pid) > 256 and _soft_open_files(capped.pid) == 128
    assert "may need 2048 open files" in capped.log_path.read_text()  # said at start

    async def fill(c: BlobnodeClient, url: str, chunks: int) -> int:
        for vid in range(1, chunks + 1):
            vuid = Vuid.make(vid, 0, 1)
            try:
                await c.create_chunk(url, 1, vuid, chunk_size=1 << 20)
                await c.put_shard(url, 1, vuid, 1, payload(vid, 100))
            except errors.Unavailable as exc:
                assert "not a disk fault" in str(exc)
                return vid - 1
        return chunks

    async def scenario(c: BlobnodeClient) -> None:
        assert await fill(c, lifted.url, 300) == 300
        assert await c.get_shard(lifted.url, 1, Vuid.make(300, 0, 1), 1) == payload(300, 100)
        made = await fill(c, capped.url, 300)
        assert 0 < made < 128
        for _ in range(5):
            with pytest.raises(errors.Unavailable):
                await c.create_chunk(capped.url, 1, Vuid.make(made + 1, 0, 1), chunk_size=1 << 20)
        assert await c.get_shard(capped.url, 1, Vuid.make(made, 0, 1), 1) == payload(made, 100)

    run(with_client(scenario))
    none = 'blobstore_blobnode_disk_io_errors_total{disk_id="1"} 0.0'
    assert _io_errors(lifted.url) == _io_errors(capped.url) == none
