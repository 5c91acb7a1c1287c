"""ChunkFile against a real file and a real KVStore: round trips, corruption, deletes, recovery."""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blobstore_server.libs.chunkfile import (
    SHARD_CF,
    ChunkCorrupted,
    ChunkError,
    ChunkFile,
    ChunkFull,
    ChunkId,
    ChunkReadOnly,
    RangeError,
    ShardCorrupted,
    ShardExists,
    ShardMarkDeleted,
    ShardNotFound,
    ShardStatus,
    Vuid,
    physical_size,
    reads,
    required_column_families,
)
from blobstore_server.libs.chunkfile import format as fmt
from blobstore_server.libs.kv import KVStore
from tests.support.chunk_records import make_version_1, record, torn_put_holding, version_1_shard_header
from tests.support.pagecache import drop, resident_pages

VUID = Vuid.make(7, 1, 1)


def payload(bid: int, size: int) -> bytes:
    return random.Random(bid).randbytes(size)


def flip(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([old[0] ^ 0x5A]), offset)
    finally:
        os.close(fd)


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[KVStore]:
    with KVStore(tmp_path / "meta", required_column_families()) as store:
        yield store


@pytest.fixture
def cid() -> ChunkId:
    return ChunkId.new(VUID)


@pytest.fixture
def chunk(tmp_path: Path, kv: KVStore, cid: ChunkId) -> Iterator[ChunkFile]:
    c = ChunkFile.create(tmp_path / str(cid), kv, cid)
    yield c
    c.close()


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 4 << 20])
def test_round_trip(chunk: ChunkFile, size: int) -> None:
    data = payload(size, size)
    meta = chunk.put_shard(42, VUID, data)
    assert (meta.bid, meta.vuid, meta.size, meta.status) == (42, VUID, size, ShardStatus.NORMAL)
    assert meta.offset % 4096 == 0 and meta.offset >= 4096
    assert chunk.read_shard(42) == data
    assert b"".join(chunk.iter_shard(42, piece=100_000)) == data
    assert chunk.stat_shard(42) == meta
    assert chunk.verify_shard(42) == meta
    assert os.path.getsize(chunk.path) == 4096 + physical_size(size)


def test_read_cached_serves_only_cached_pages_and_small_ranges(chunk: ChunkFile) -> None:
    """The event loop's read: bytes when every page is in the page cache, None (the caller goes to a disk thread)
    once the kernel dropped them, and for a range over the limit; lookups fail as in read_shard."""
    small, large = payload(1, 10_000), payload(2, 200_000)
    chunk.put_shard(1, VUID, small)
    chunk.put_shard(2, VUID, large)
    meta, data = chunk.read_cached(1, 0, None, 64 << 10)
    assert data == small and meta.size == len(small)
    assert chunk.read_cached(1, 100, 50, 64 << 10)[1] == small[100:150]
    assert chunk.read_cached(2, 0, None, 64 << 10) == (chunk.stat_shard(2), None)  # over the limit
    assert chunk.read_cached(2, 1000, 100, 64 << 10)[1] == large[1000:1100]  # a small range of it is fine
    drop(chunk.path)  # synced, so clean: the kernel can drop every page
    meta, data = chunk.read_cached(1, 0, None, 64 << 10)
    # the miss starts readahead, which on this fast disk often finishes before the read looks again: either is right
    assert meta == chunk.stat_shard(1) and data in (None, small)
    assert chunk.read_shard(1) == small  # a waiting read brings the pages back
    assert chunk.read_cached(1, 0, None, 64 << 10)[1] == small
    with pytest.raises(ShardNotFound):
        chunk.read_cached(3, 0, None, 64 << 10)
    with pytest.raises(RangeError):
        chunk.read_cached(1, 9_999, 2, 64 << 10)


def test_read_cached_answers_none_when_the_kernel_would_wait(chunk: ChunkFile, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """FAKE kernel answer: a `RWF_NOWAIT` read that would wait on the disk fails with EAGAIN, which a real miss
    cannot be made to give every time (its readahead may finish first). read_cached then answers None, and a
    read that may wait is not affected."""
    small = payload(1, 10_000)
    chunk.put_shard(1, VUID, small)
    real_preadv = os.preadv

    def preadv(fd: int, buffers: list[memoryview], offset: int, flags: int = 0) -> int:
        if flags & os.RWF_NOWAIT:
            raise BlockingIOError(errno.EAGAIN, "would wait on the disk")
        return real_preadv(fd, buffers, offset, flags)

    monkeypatch.setattr(reads.os, "preadv", preadv)
    assert chunk.read_cached(1, 0, None, 64 << 10) == (chunk.stat_shard(1), None)
    assert chunk.read_shard(1) == small


def test_direct_puts_land_page_aligned_past_the_page_cache_and_survive_a_reopen(kv: KVStore,
                                                                                  chunk: ChunkFile) -> None:
    """Background writes (`direct`, O_DIRECT) among ordinary ones: each starts on a page, leaves nothing in the
    page cache (a cached read finds nothing, where an ordinary put's bytes are there), reads back checked, and
    a reopen keeps every shard and cuts the last one's padding; the next puts append after it."""
    sizes = {1: 10_000, 2: 200_001, 3: 1, 4: 3 * 65_536, 5: 0, 6: 70_000}
    direct = {2, 3, 5, 6}
    metas = {bid: chunk.put_shard(bid, VUID, payload(bid, size), direct=bid in direct) for bid, size in sizes.items()}
    assert all(metas[bid].offset % mmap.PAGESIZE == 0 for bid in direct)
    assert [resident_pages(chunk.path, metas[bid].offset, physical_size(sizes[bid])) for bid in (2, 6)] == [0, 0]
    assert chunk.read_cached(1, 0, None, 1 << 20)[1] == payload(1, sizes[1])
    for bid, size in sizes.items():
        assert chunk.read_shard(bid) == payload(bid, size)
        assert chunk.verify_shard(bid) == metas[bid]
    chunk.close()
    c = ChunkFile.open(chunk.path, kv, chunk.chunk_id)
    end = metas[6].offset + physical_size(sizes[6])
    assert os.path.getsize(c.path) == c.stats().write_offset == end
    assert c.put_shard(7, VUID, payload(7, 5)).offset == end
    assert c.put_shard(8, VUID, payload(8, 5), direct=True).offset == -(-(end + physical_size(5)) // 4096) * 4096
    for bid, size in {**sizes, 7: 5, 8: 5}.items():
        assert c.read_shard(bid) == payload(bid, size)
    c.close()


def test_direct_reads_leave_the_page_cache_alone(kv: KVStore, chunk: ChunkFile) -> None:
    """Background reads (`direct`) of shards on disk only: right bytes, pieces and ranges, from the writer's
    chunk and from one opened read-only (the background reader's), and the pages stay out of the cache, where an
    ordinary read brings them in; a flipped byte still fails its block."""
    sizes = {1: 10_000, 2: 200_001, 3: 1, 4: 0, 5: 5 * 65_536 + 7}
    metas = {bid: chunk.put_shard(bid, VUID, payload(bid, size)) for bid, size in sizes.items()}
    drop(chunk.path)
    reader = ChunkFile.open_readonly(chunk.path, kv, chunk.chunk_id)
    try:
        for c in (chunk, reader):
            for bid, size in sizes.items():
                assert b"".join(c.iter_shard(bid, direct=True)) == payload(bid, size)
                assert b"".join(c.iter_shard(bid, size // 3, size // 2, piece=65_536, direct=True)) == \
                    payload(bid, size)[size // 3:size // 3 + size // 2]
        extents = {bid: (metas[bid].offset, physical_size(sizes[bid])) for bid in (2, 5)}
        assert [resident_pages(chunk.path, *extents[bid]) for bid in (2, 5)] == [0, 0]
        assert b"".join(chunk.iter_shard(2)) == payload(2, sizes[2])
        assert resident_pages(chunk.path, *extents[2]) == -(-extents[2][1] // mmap.PAGESIZE)
        assert chunk.read_cached(2, 0, None, 1 << 20)[1] == payload(2, sizes[2])
        flip(chunk.path, metas[5].offset + fmt.block_pos(3) + 4 + 10)  # a data byte of block 3
        with pytest.raises(ShardCorrupted, match="block 3"):
            list(reader.iter_shard(5, direct=True))
        assert b"".join(reader.iter_shard(5, 0, 3 * 65_536, direct=True)) == payload(5, sizes[5])[:3 * 65_536]
    finally:
        reader.close()


@pytest.fixture(scope="module")
def ranged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ChunkFile, bytes]]:
    base = tmp_path_factory.mktemp("ranged")
    with KVStore(base / "meta", required_column_families()) as store:
        cid = ChunkId.new(VUID)
        c = ChunkFile.create(base / "chunk", store, cid, sync=False)
        data = payload(1, 5 * 65536 + 1234)
        c.put_shard(1, VUID, data)
        yield c, data
        c.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_ranges_equal_slices(ranged: tuple[ChunkFile, bytes], data: st.DataObject) -> None:
    c, original = ranged
    lo = data.draw(st.integers(0, len(original)))
    n = data.draw(st.integers(0, len(original) - lo))
    assert c.read_shard(1, lo, n) == original[lo:lo + n]
    piece = data.draw(st.integers(1, 4 * 65536))
    assert b"".join(c.iter_shard(1, lo, n, piece=piece)) == original[lo:lo + n]
    assert b"".join(c.iter_shard(1, lo, n, piece=piece, direct=True)) == original[lo:lo + n]
    if data.draw(st.booleans()):
        assert c.read_shard(1, lo) == original[lo:]


def test_out_of_range_reads(chunk: ChunkFile) -> None:
    chunk.put_shard(1, VUID, b"x" * 100)
    for offset, size in [(-1, 1), (0, 101), (100, 1), (101, None), (5, -1)]:
        with pytest.raises(RangeError):
            chunk.read_shard(1, offset, size)
        with pytest.raises(RangeError):
            chunk.iter_shard(1, offset, size)
    assert chunk.read_shard(1, 100) == b""
    with pytest.raises(ShardNotFound):
        chunk.read_shard(2)
    with pytest.raises(ShardNotFound):
        chunk.iter_shard(2)


def test_flipped_block_byte_only_fails_ranges_touching_it(chunk: ChunkFile) -> None:
    data = payload(3, 4 * 65536 + 10)
    meta = chunk.put_shard(3, VUID, data)
    flip(chunk.path, meta.offset + fmt.block_pos(2) + 4 + 1000)  # a data byte of block 2
    with pytest.raises(ShardCorrupted, match="block 2"):
        chunk.read_shard(3)
    with pytest.raises(ShardCorrupted, match="block 2"):
        chunk.read_shard(3, 2 * 65536 + 5, 1)
    with pytest.raises(ShardCorrupted):
        chunk.read_shard(3, 65536, 65537)  # ends one byte into block 2
    with pytest.raises(ShardCorrupted):
        list(chunk.iter_shard(3))
    with pytest.raises(ShardCorrupted):
        chunk.verify_shard(3)
    assert chunk.read_shard(3, 0, 2 * 65536) == data[:2 * 65536]
    assert chunk.read_shard(3, 3 * 65536) == data[3 * 65536:]


def test_flipped_block_crc_is_detected(chunk: ChunkFile) -> None:
    meta = chunk.put_shard(3, VUID, payload(3, 3 * 65536))
    flip(chunk.path, meta.offset + fmt.block_pos(1))
    with pytest.raises(ShardCorrupted, match="block 1"):
        chunk.read_shard(3, 65536, 10)
    assert chunk.read_shard(3, 0, 10) == payload(3, 3 * 65536)[:10]


def test_reads_longer_than_one_preadv_are_whole_and_checked(chunk: ChunkFile) -> None:
    """A range of more blocks than one preadv's IOV_MAX buffers (two per block) is read in batches: every byte
    comes back in place, read-only, and a flipped byte in a later batch is still caught."""
    blocks = os.sysconf("SC_IOV_MAX") // 2 + 40
    data = payload(4, blocks * 65536 - 123)
    meta = chunk.put_shard(4, VUID, data)
    whole = chunk.read_shard(4)
    assert whole == data and whole.readonly
    lo = (blocks - 50) * 65536 + 7
    assert chunk.read_shard(4, lo, 20 * 65536) == data[lo:lo + 20 * 65536]
    flip(chunk.path, meta.offset + fmt.block_pos(blocks - 3) + 4 + 9)
    with pytest.raises(ShardCorrupted, match=f"block {blocks - 3}"):
        chunk.read_shard(4)
    assert chunk.read_shard(4, 0, lo) == data[:lo]


@pytest.mark.parametrize("where", ["header", "footer"])
def test_flipped_header_or_footer_is_detected(chunk: ChunkFile, where: str) -> None:
    size = 3 * 65536 + 7
    meta = chunk.put_shard(5, VUID, payload(5, size))
    first = 0 if where == "header" else fmt.footer_pos(size)
    for rel in range(first, first + (32 if where == "header" else 8)):  # every byte, pad included
        flip(chunk.path, meta.offset + rel)
        with pytest.raises(ShardCorrupted):
            chunk.verify_shard(5)
        with pytest.raises(ShardCorrupted):
            chunk.read_shard(5, 0 if where == "header" else size - 1, 1)
        flip(chunk.path, meta.offset + rel)  # flip back
        assert chunk.read_shard(5) == payload(5, size)


def test_empty_shard_header_damage_is_detected(chunk: ChunkFile) -> None:
    meta = chunk.put_shard(9, VUID, b"")
    flip(chunk.path, meta.offset + 8)
    with pytest.raises(ShardCorrupted):
        chunk.read_shard(9)


def test_duplicate_put_is_idempotent_but_different_bytes_conflict(chunk: ChunkFile) -> None:
    first = chunk.put_shard(1, VUID, b"hello")
    assert chunk.put_shard(1, VUID, bytearray(b"hello")) == first
    with pytest.raises(ShardExists):
        chunk.put_shard(1, VUID, b"hellp")
    with pytest.raises(ShardExists):
        chunk.put_shard(1, VUID, b"hello!")
    with pytest.raises(ShardExists):
        chunk.put_shard(1, VUID + 1, b"hello")
    assert chunk.stats().shard_count == 1
    assert chunk.stats().write_offset == 4096 + physical_size(5)


def test_concurrent_duplicate_puts_make_one_entry(chunk: ChunkFile) -> None:
    data = payload(8, 300_000)
    results: list[object] = []
    start = threading.Barrier(8)

    def put() -> None:
        start.wait()
        results.append(chunk.put_shard(8, VUID, data))

    threads = [threading.Thread(target=put) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and len(set(results)) == 1  # type: ignore[arg-type]
    assert len(chunk.list_shards()) == 1
    assert chunk.stats().write_offset == 4096 + physical_size(len(data))


def test_concurrent_puts_and_reads(chunk: ChunkFile) -> None:
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        try:
            for bid in range(first, first + 20):
                chunk.put_shard(bid, VUID, payload(bid, bid * 997 % 200_000))
                assert chunk.read_shard(bid) == payload(bid, bid * 997 % 200_000)
                back = bid - 3
                if back >= first:
                    assert chunk.read_shard(back, 10, None) == payload(back, back * 997 % 200_000)[10:]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k * 100,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    metas = chunk.list_shards()
    assert len(metas) == 80
    extents = sorted((m.offset, m.offset + physical_size(m.size)) for m in metas)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(extents))
    assert chunk.stats().punched_bytes == 0


def test_list_shards_orders_by_bid_and_filters(chunk: ChunkFile) -> None:
    for bid in (300, 5, 2**40, 17):
        chunk.put_shard(bid, VUID, b"x")
    assert [m.bid for m in chunk.list_shards()] == [5, 17, 300, 2**40]
    assert [m.bid for m in chunk.list_shards(start_bid=17, count=2)] == [17, 300]
    chunk.mark_delete(300)
    assert [m.bid for m in chunk.list_shards(status=ShardStatus.MARK_DELETED)] == [300]
    assert [m.bid for m in chunk.list_shards(status=ShardStatus.NORMAL, count=2)] == [5, 17]
    assert chunk.list_shards(count=0) == []


def test_mark_and_unmark_delete(tmp_path: Path, kv: KVStore, chunk: ChunkFile) -> None:
    chunk.put_shard(1, VUID, b"abc")
    assert chunk.mark_delete(1).status == ShardStatus.MARK_DELETED
    assert chunk.mark_delete(1).status == ShardStatus.MARK_DELETED  # idempotent
    with pytest.raises(ShardMarkDeleted):
        chunk.read_shard(1)
    with pytest.raises(ShardMarkDeleted):
        chunk.iter_shard(1)
    assert chunk.stat_shard(1).status == ShardStatus.MARK_DELETED
    assert chunk.put_shard(1, VUID, b"abc").status == ShardStatus.MARK_DELETED  # retry, same bytes
    chunk.close()
    reopened = ChunkFile.open(chunk.path, kv, chunk.chunk_id)
    with pytest.raises(ShardMarkDeleted):
        reopened.read_shard(1)
    assert reopened.unmark_delete(1).status == ShardStatus.NORMAL
    assert reopened.read_shard(1) == b"abc"
    with pytest.raises(ShardNotFound):
        reopened.mark_delete(2)
    reopened.close()


def test_delete_punches_a_hole(chunk: ChunkFile) -> None:
    for bid in range(1, 5):
        chunk.put_shard(bid, VUID, payload(bid, 1 << 20))
    before = chunk.stats()
    assert before.disk_bytes >= 4 << 20
    chunk.mark_delete(2)
    chunk.delete_shard(2)
    chunk.delete_shard(3)  # direct delete without mark is allowed
    after = chunk.stats()
    phys = physical_size(1 << 20)
    # ext4 may spend a block or two on extent-tree metadata once the file has holes.
    assert before.disk_bytes - after.disk_bytes >= 2 * phys - 4 * 4096
    assert after.punched_bytes == 2 * phys
    assert (after.shard_count, after.live_bytes) == (2, 2 << 20)
    assert after.write_offset == before.write_offset
    assert os.path.getsize(chunk.path) == before.write_offset  # KEEP_SIZE
    for bid in (2, 3):
        with pytest.raises(ShardNotFound):
            chunk.read_shard(bid)
        with pytest.raises(ShardNotFound):
            chunk.delete_shard(bid)
    assert chunk.read_shard(1) == payload(1, 1 << 20)
    assert chunk.read_shard(4) == payload(4, 1 << 20)


def test_compaction_moves_live_shards(tmp_path: Path, kv: KVStore, chunk: ChunkFile) -> None:
    sizes = {1: 70_000, 2: 1 << 20, 3: 0, 4: 5, 5: 200_000}
    for bid, size in sizes.items():
        chunk.put_shard(bid, VUID, payload(bid, size))
    chunk.delete_shard(2)
    chunk.mark_delete(4)
    new_id = ChunkId(VUID, chunk.chunk_id.timestamp + 1)
    extra: list[int] = []
    new = chunk.compact_into(tmp_path / str(new_id), new_id, before_commit=lambda b: extra.append(b.count))
    assert extra == [9]  # 4 puts + 4 deletes + the old chunk's watermark dropped, in the same batch
    assert new.parent == chunk.chunk_id
    assert [m.bid for m in new.list_shards()] == [1, 3, 4, 5]
    assert new.tag not in (0, chunk.tag)  # a chunk's own, carried by the copies
    for meta in new.list_shards():
        assert header_at(new.path, meta.offset) == (meta.bid, VUID, meta.size, new.tag)
    assert chunk.list_shards() == []
    for bid in (1, 3, 5):
        assert new.read_shard(bid) == payload(bid, sizes[bid])
    with pytest.raises(ShardMarkDeleted):
        new.read_shard(4)
    assert new.unmark_delete(4) and new.read_shard(4) == payload(4, 5)
    with pytest.raises(ShardNotFound):
        new.read_shard(2)
    with pytest.raises(ChunkReadOnly):
        chunk.put_shard(9, VUID, b"late")
    stats = new.stats()
    assert stats.punched_bytes == 0 and stats.shard_count == 4
    assert stats.write_offset < chunk.stats().write_offset
    chunk.close()
    new.close()
    reopened = ChunkFile.open(tmp_path / str(new_id), kv, new_id)
    assert reopened.parent == chunk.chunk_id
    assert reopened.read_shard(5) == payload(5, sizes[5])
    reopened.close()


def test_compaction_refuses_a_corrupt_shard_and_leaves_old_chunk_intact(
        tmp_path: Path, chunk: ChunkFile) -> None:
    chunk.put_shard(1, VUID, payload(1, 1000))
    meta = chunk.put_shard(2, VUID, payload(2, 1000))
    flip(chunk.path, meta.offset + 100)
    new_id = ChunkId(VUID, 1)
    with pytest.raises(ShardCorrupted):
        chunk.compact_into(tmp_path / "new", new_id)
    assert not (tmp_path / "new").exists()
    assert [m.bid for m in chunk.list_shards()] == [1, 2]
    chunk.put_shard(3, VUID, b"still writable")


def test_reopen_sees_everything(tmp_path: Path, kv: KVStore, chunk: ChunkFile) -> None:
    for bid in range(1, 30):
        chunk.put_shard(bid, VUID, payload(bid, bid * 3001))
    chunk.delete_shard(10)
    stats = chunk.stats()
    chunk.close()
    with pytest.raises(Exception, match="closed"):
        chunk.read_shard(1)
    c = ChunkFile.open(chunk.path, kv, chunk.chunk_id)
    assert c.parent is None
    for bid in range(1, 30):
        if bid != 10:
            assert c.read_shard(bid) == payload(bid, bid * 3001)
    again = c.stats()
    assert (again.shard_count, again.live_bytes, again.write_offset) == (
        stats.shard_count, stats.live_bytes, stats.write_offset)
    c.close()


@pytest.mark.parametrize("tail", ["garbage", "half_shard"])
def test_torn_tail_is_cut_on_open(tmp_path: Path, kv: KVStore, chunk: ChunkFile, tail: str) -> None:
    chunk.put_shard(1, VUID, payload(1, 100_000))
    chunk.put_shard(2, VUID, payload(2, 10))
    end = chunk.stats().write_offset
    chunk.close()
    junk = os.urandom(12_345) if tail == "garbage" else record(3, VUID, payload(3, 150_000), chunk.tag)[:75_000]
    with open(chunk.path, "ab") as f:
        f.write(junk)
    c = ChunkFile.open(chunk.path, kv, chunk.chunk_id)
    assert os.path.getsize(c.path) == end
    assert c.stats().write_offset == end
    with pytest.raises(ShardNotFound):
        c.read_shard(3)
    meta = c.put_shard(4, VUID, payload(4, 70_000))
    assert meta.offset == end
    for bid, size in ((1, 100_000), (2, 10), (4, 70_000)):
        assert c.read_shard(bid) == payload(bid, size)
    c.close()


def header_at(path: Path, offset: int) -> fmt.ShardHeader | None:
    with open(path, "rb") as f:
        f.seek(offset)
        return fmt.parse_shard_header(f.read(fmt.SHARD_HEADER_SIZE))


@pytest.mark.parametrize("vuid", [VUID, Vuid.make(7, 1, 2)], ids=["this vuid", "this unit, another epoch"])
@pytest.mark.parametrize("guess", ["untagged", "one bit off"])
def test_a_record_crafted_inside_a_torn_put_is_not_indexed_on_open(kv: KVStore, chunk: ChunkFile, vuid: Vuid,
                                                                  guess: str) -> None:
    """A put torn by a crash leaves its header and part of its payload, and a payload (user bytes) may hold a
    complete shard record naming this very unit at a 4 KiB boundary of the file. Open indexes again the complete
    records past the watermark: not that one, which cannot carry the chunk's tag (no user sees it)."""
    chunk.put_shard(1, VUID, payload(1, 10_000))
    end = chunk.stats().write_offset
    chunk.close()
    tag = 0 if guess == "untagged" else chunk.tag ^ 1 << random.randrange(32)
    crafted = record(99, vuid, payload(99, 5_000), tag)
    with open(chunk.path, "ab") as f:
        f.write(torn_put_holding(crafted, 2, VUID, chunk.tag))
    assert header_at(chunk.path, end + fmt.ALIGN) == (99, vuid, 5_000, tag)  # complete, valid, at the boundary
    c = ChunkFile.open(chunk.path, kv, chunk.chunk_id)
    try:
        assert [m.bid for m in c.list_shards()] == [1]
        assert os.path.getsize(c.path) == end  # the torn put cut off, the record inside it too
    finally:
        c.close()


def test_a_record_of_another_chunk_at_an_indexed_offset_is_corruption_never_data(chunk: ChunkFile) -> None:
    """A record that does not carry the chunk's tag (one copied from another chunk of the unit, or found where it
    should not have been) is never served, though its own CRCs all hold."""
    size = 100_000
    meta = chunk.put_shard(5, VUID, payload(5, size))
    other = fmt.pack_shard_header(5, VUID, size, chunk.tag ^ 1)
    fd = os.open(chunk.path, os.O_RDWR)
    try:
        os.pwrite(fd, other, meta.offset)
    finally:
        os.close(fd)
    for read in (lambda: chunk.read_shard(5), lambda: chunk.read_shard(5, 0, 1), lambda: chunk.verify_shard(5)):
        with pytest.raises(ShardCorrupted, match="tag"):
            read()


def test_a_version_1_chunk_opens_reads_takes_puts_and_compacts_into_a_tagged_one(tmp_path: Path, kv: KVStore,
                                                                                 cid: ChunkId) -> None:
    """Chunks made before the tag stay as they are: untagged records (the layout before the tag, byte for byte) in
    and out, and open keeps its rule for them (a record inside a torn put naming another unit is not indexed).
    Compaction moves their shards into a chunk with a tag, which the copies carry."""
    ChunkFile.create(tmp_path / "old", kv, cid).close()
    make_version_1(tmp_path / "old")
    old = ChunkFile.open(tmp_path / "old", kv, cid)
    assert old.tag == 0
    first = old.put_shard(1, VUID, payload(1, 70_000))
    old.put_shard(2, VUID, payload(2, 10))
    with open(old.path, "rb") as f:
        f.seek(first.offset)
        assert f.read(fmt.SHARD_HEADER_SIZE) == version_1_shard_header(1, VUID, 70_000)
    end = old.stats().write_offset
    old.close()
    crafted = record(99, Vuid.make(7, 2, 1), payload(99, 5_000), 0)
    with open(old.path, "ab") as f:
        f.write(torn_put_holding(crafted, 3, VUID, 0))
    old = ChunkFile.open(tmp_path / "old", kv, cid)
    try:
        assert [m.bid for m in old.list_shards()] == [1, 2]
        assert os.path.getsize(old.path) == end
        old.put_shard(3, VUID, payload(3, 200_000))
        for bid, size in ((1, 70_000), (2, 10), (3, 200_000)):
            assert old.read_shard(bid) == payload(bid, size)
        assert fmt.ChunkHeader.unpack(old.path.read_bytes()[:fmt.CHUNK_HEADER_SIZE]).version == 1
        new_id = ChunkId(VUID, cid.timestamp + 1)
        new = old.compact_into(tmp_path / "new", new_id)
    finally:
        old.close()
    try:
        assert new.tag != 0
        for meta in new.list_shards():
            assert header_at(new.path, meta.offset) == (meta.bid, VUID, meta.size, new.tag)
            assert new.read_shard(meta.bid) == payload(meta.bid, meta.size)
    finally:
        new.close()


def test_index_entries_past_eof_are_dropped_on_open(kv: KVStore, chunk: ChunkFile) -> None:
    chunk.put_shard(1, VUID, payload(1, 10))
    m2 = chunk.put_shard(2, VUID, payload(2, 10))
    chunk.close()
    os.truncate(chunk.path, m2.offset + 100)  # as if an unsynced write was lost
    c = ChunkFile.open(chunk.path, kv, chunk.chunk_id)
    assert [m.bid for m in c.list_shards()] == [1]
    assert os.path.getsize(c.path) == m2.offset
    c.close()


def test_bad_chunk_header_is_refused(kv: KVStore, chunk: ChunkFile) -> None:
    chunk.put_shard(1, VUID, b"x")
    chunk.close()
    flip(chunk.path, 6)
    with pytest.raises(ChunkCorrupted):
        ChunkFile.open(chunk.path, kv, chunk.chunk_id)
    os.truncate(chunk.path, 0)
    with pytest.raises(ChunkCorrupted):
        ChunkFile.open(chunk.path, kv, chunk.chunk_id)


def test_create_refuses_existing_file_or_index(tmp_path: Path, kv: KVStore, chunk: ChunkFile) -> None:
    with pytest.raises(FileExistsError):
        ChunkFile.create(chunk.path, kv, chunk.chunk_id)
    chunk.put_shard(1, VUID, b"x")
    with pytest.raises(Exception, match="index already holds"):
        ChunkFile.create(tmp_path / "other", kv, chunk.chunk_id)
    chunk.remove_index()
    assert chunk.list_shards() == [] and chunk.stats().shard_count == 0
    assert list(kv.items(SHARD_CF)) == []


def test_max_size_raises_chunk_full(tmp_path: Path, kv: KVStore) -> None:
    cid = ChunkId.new(VUID)
    c = ChunkFile.create(tmp_path / "c", kv, cid, max_size=4096 + 2 * 4096)
    c.put_shard(1, VUID, b"a" * 4000)
    c.put_shard(2, VUID, b"b" * 4000)
    with pytest.raises(ChunkFull):
        c.put_shard(3, VUID, b"c")
    c.close()
    c = ChunkFile.open(tmp_path / "c", kv, cid, max_size=3 * 4096)
    with pytest.raises(ChunkFull):
        c.put_shard(3, VUID, b"c")
    c.close()


def test_chunks_in_one_store_are_separate(tmp_path: Path, kv: KVStore) -> None:
    a = ChunkFile.create(tmp_path / "a", kv, ChunkId(VUID, 1), sync=False)
    b = ChunkFile.create(tmp_path / "b", kv, ChunkId(VUID, 2), sync=False)
    a.put_shard(1, VUID, b"from a")
    b.put_shard(1, VUID, b"from b")
    assert a.read_shard(1) == b"from a" and b.read_shard(1) == b"from b"
    a.remove_index()
    assert b.read_shard(1) == b"from b"
    a.close()
    b.close()


def test_delete_during_a_stream_reads_as_not_found(chunk: ChunkFile) -> None:
    chunk.put_shard(1, VUID, payload(1, 3 * 65536))
    pieces = chunk.iter_shard(1, piece=65536)
    assert next(pieces) == payload(1, 3 * 65536)[:65536]
    chunk.delete_shard(1)  # punches the hole under the open stream
    with pytest.raises(ShardNotFound):
        next(pieces)


def test_closed_chunk_refuses_work(chunk: ChunkFile) -> None:
    chunk.put_shard(1, VUID, b"x")
    chunk.close()
    chunk.close()  # idempotent
    for call in (lambda: chunk.put_shard(2, VUID, b"y"), lambda: chunk.read_shard(1),
                 lambda: chunk.mark_delete(1), chunk.stats):
        with pytest.raises(ChunkError, match="closed"):
            call()


def test_unsynced_chunk_still_round_trips(tmp_path: Path, kv: KVStore) -> None:
    cid = ChunkId.new(VUID)
    with ChunkFile.create(tmp_path / "c", kv, cid, sync=False) as c:
        c.put_shard(1, VUID, payload(1, 100_000))
    with ChunkFile.open(tmp_path / "c", kv, cid, sync=False) as c:
        assert c.read_shard(1) == payload(1, 100_000)


def test_index_records_when_a_shard_was_written_and_marked_and_reads_old_entries(chunk: ChunkFile,
                                                                                  kv: KVStore) -> None:
    import struct
    import time

    before = int(time.time())
    meta = chunk.put_shard(1, VUID, b"abc")
    assert before <= meta.written_at <= time.time() and meta.marked_at == 0
    marked = chunk.mark_delete(1)
    assert marked.written_at == meta.written_at and marked.marked_at >= before
    assert chunk.unmark_delete(1).marked_at == 0
    # A value written before times were indexed (version 1) still reads, with both times unknown (0).
    kv.put(SHARD_CF, chunk.chunk_id.to_bytes() + struct.pack(">Q", 2),
           struct.pack("<BQIIBQ", 1, meta.offset, meta.size, meta.crc, 1, VUID))
    old = chunk.stat_shard(2)
    assert (old.size, old.written_at, old.marked_at) == (meta.size, 0, 0)
