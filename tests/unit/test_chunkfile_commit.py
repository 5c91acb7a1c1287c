"""Group commit across the chunk files of one disk (libs/chunkfile/commit.py), on real files and RocksDB."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blobstore_server.libs.chunkfile import (
    ChunkError,
    ChunkFile,
    ChunkId,
    ChunkReadOnly,
    GroupCommit,
    ShardMeta,
    StagedPut,
    Vuid,
    required_column_families,
)
from blobstore_server.libs.chunkfile.index import ShardIndex
from blobstore_server.libs.kv import Batch, KVStore


class CountingStore(KVStore):
    """A real store that counts its batch writes."""

    writes = 0

    def write(self, batch: Batch, *, sync: bool = True) -> None:
        self.writes += 1
        super().write(batch, sync=sync)


class FailingSync(ChunkFile):
    """FAKE fault: a chunk whose fdatasync reports EIO (a dying disk cannot be produced for real here)."""

    def sync_data(self) -> None:
        raise OSError(errno.EIO, "injected: fdatasync failed")


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[CountingStore]:
    with CountingStore(tmp_path / "meta", required_column_families()) as store:
        yield store


def make_chunk(tmp_path: Path, kv: KVStore, commits: GroupCommit, disk_unit: int,
               kind: type[ChunkFile] = ChunkFile) -> ChunkFile:
    cid = ChunkId.new(Vuid.make(disk_unit, 0, 1))
    return kind.create(tmp_path / str(cid), kv, cid, commits=commits)


def staged(chunk: ChunkFile, bid: int, data: bytes = b"shard bytes") -> StagedPut:
    result = chunk.stage_put(bid, chunk.chunk_id.vuid, data)
    assert isinstance(result, StagedPut)
    return result


def test_puts_to_several_chunks_commit_in_one_index_batch(tmp_path: Path, kv: CountingStore) -> None:
    commits = GroupCommit(kv)
    chunks = [make_chunk(tmp_path, kv, commits, unit) for unit in (1, 2, 3)]
    ended: list[BaseException | None] = []
    queued = [staged(chunk, bid) for bid, chunk in enumerate(chunks * 2, start=1)]
    leads = [commits.enqueue(put, ended.append) for put in queued]
    assert leads == [True] + [False] * 5  # the first to queue leads; the others only wait
    before = kv.writes
    commits.lead()
    assert ended == [None] * 6 and kv.writes == before + 1
    for bid, chunk in enumerate(chunks * 2, start=1):
        assert chunk.read_shard(bid) == b"shard bytes"
        assert chunk.stats().shard_count == 2
    for chunk in chunks:
        chunk.close()


def test_a_staged_put_is_neither_readable_nor_counted_before_its_commit(tmp_path: Path, kv: KVStore) -> None:
    commits = GroupCommit(kv)
    chunk = make_chunk(tmp_path, kv, commits, 1)
    put = staged(chunk, 5)
    with pytest.raises(ChunkError):
        chunk.read_shard(5)
    assert chunk.stats().shard_count == 0
    commits.commit(put)
    assert chunk.read_shard(5) == b"shard bytes" and chunk.stats().shard_count == 1
    chunk.close()


def test_a_failed_sync_fails_only_that_chunks_puts_and_retires_it(tmp_path: Path, kv: CountingStore) -> None:
    commits = GroupCommit(kv)
    good = make_chunk(tmp_path, kv, commits, 1)
    bad = make_chunk(tmp_path, kv, commits, 2, FailingSync)
    ended: dict[int, BaseException | None] = {}
    for bid, chunk in ((1, good), (2, bad), (3, good), (5, bad)):
        commits.enqueue(staged(chunk, bid), lambda error, bid=bid: ended.__setitem__(bid, error))
    commits.lead()
    assert ended[1] is None and ended[3] is None
    assert isinstance(ended[2], OSError) and ended[2].errno == errno.EIO  # the failed call's own error, once
    assert isinstance(ended[5], ChunkError) and ended[5].__cause__ is ended[2]  # a disk counts one failure
    assert good.read_shard(3) == b"shard bytes"
    with pytest.raises(ChunkError):
        bad.read_shard(2)  # never indexed
    with pytest.raises(ChunkReadOnly, match="broken"):
        bad.put_shard(4, bad.chunk_id.vuid, b"later")
    good.close()
    bad.close()


def test_non_blocking_stage_declines_a_bid_being_written_or_already_stored(tmp_path: Path, kv: KVStore) -> None:
    commits = GroupCommit(kv)
    chunk = make_chunk(tmp_path, kv, commits, 1)
    vuid = chunk.chunk_id.vuid
    put = staged(chunk, 9)
    assert chunk.stage_put(9, vuid, b"shard bytes", blocking=False) is None  # pending
    commits.commit(put)
    assert chunk.stage_put(9, vuid, b"shard bytes", blocking=False) is None  # stored: compare on a thread
    again = chunk.stage_put(9, vuid, b"shard bytes")
    assert isinstance(again, ShardMeta) and again == put.meta
    chunk.close()


def test_many_threads_share_groups_and_every_put_is_indexed(tmp_path: Path, kv: CountingStore) -> None:
    commits = GroupCommit(kv)
    chunks = [make_chunk(tmp_path, kv, commits, unit) for unit in (1, 2)]
    before = kv.writes

    def writer(first: int) -> None:
        for bid in range(first, first + 50):
            chunks[bid % 2].put_shard(bid, chunks[bid % 2].chunk_id.vuid, bid.to_bytes(8, "big") * 100)

    threads = [threading.Thread(target=writer, args=(n * 1000,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert kv.writes - before < 300  # groups formed: one index write per put would be 400 (seen: 127-153)
    for n in range(8):
        for bid in range(n * 1000, n * 1000 + 50):
            assert chunks[bid % 2].read_shard(bid) == bid.to_bytes(8, "big") * 100
    assert sum(c.stats().shard_count for c in chunks) == 400
    for chunk in chunks:
        chunk.close()


def test_submitted_puts_are_led_by_the_commits_own_thread(tmp_path: Path, kv: CountingStore) -> None:
    commits = GroupCommit(kv)
    chunk = make_chunk(tmp_path, kv, commits, 1)
    ended: dict[int, tuple[BaseException | None, str]] = {}
    all_done = threading.Event()

    def done_for(bid: int) -> Callable[[BaseException | None], None]:
        def done(error: BaseException | None) -> None:
            ended[bid] = (error, threading.current_thread().name)
            if len(ended) == 20:
                all_done.set()
        return done

    for bid in range(20):
        commits.submit([(staged(chunk, bid), done_for(bid))])  # returns at once: the caller never leads
    assert all_done.wait(10)
    assert {error for error, _ in ended.values()} == {None}
    assert {name for _, name in ended.values()} == {"group-commit"}
    assert chunk.stats().shard_count == 20
    commits.close()
    chunk.close()


def test_puts_submitted_together_commit_in_one_group(tmp_path: Path, kv: CountingStore) -> None:
    """What a blobnode's batched put relies on: one submit is one group (one index write), so it is told once."""
    commits = GroupCommit(kv)
    chunks = [make_chunk(tmp_path, kv, commits, unit) for unit in (1, 2)]
    ended: list[BaseException | None] = []
    all_done = threading.Event()

    def done(error: BaseException | None) -> None:
        ended.append(error)
        if len(ended) == 10:
            all_done.set()

    writes_before = kv.writes
    commits.submit([(staged(chunks[bid % 2], bid), done) for bid in range(10)])
    assert all_done.wait(10)
    assert ended == [None] * 10
    assert kv.writes == writes_before + 1
    commits.close()
    for chunk in chunks:
        chunk.close()


def test_a_put_submitted_after_close_still_commits(tmp_path: Path, kv: CountingStore) -> None:
    commits = GroupCommit(kv)
    chunk = make_chunk(tmp_path, kv, commits, 1)
    first = threading.Event()
    commits.submit([(staged(chunk, 1), lambda error: first.set())])  # starts the committer thread
    assert first.wait(10)
    commits.close()  # the thread ends
    ended: list[BaseException | None] = []
    commits.submit([(staged(chunk, 2), ended.append)])  # led inline: a chunk's close would wait for it forever
    assert ended == [None] and chunk.read_shard(2) == b"shard bytes"
    chunk.close()


def test_a_shard_deleted_while_a_put_below_it_is_under_way_is_not_found_again_on_open(
        tmp_path: Path, kv: KVStore) -> None:
    """Open indexes again the complete shards past the watermark; a delete moves the watermark past its shard
    first, which it can only do once the put below (still writing) has settled."""
    commits = GroupCommit(kv)
    chunk = make_chunk(tmp_path, kv, commits, 1)
    below = staged(chunk, 1, b"put under way")
    chunk.put_shard(2, chunk.chunk_id.vuid, b"deleted later")  # its group leaves the watermark at bid 1's offset
    deleting = threading.Thread(target=chunk.delete_shard, args=(2,))
    deleting.start()
    deleting.join(0.3)
    assert deleting.is_alive()  # waits for bid 1
    commits.commit(below)
    deleting.join(10)
    assert not deleting.is_alive()
    chunk.close()
    again = ChunkFile.open(chunk.path, kv, chunk.chunk_id, commits=commits)
    assert [m.bid for m in again.list_shards()] == [1]
    assert again.read_shard(1) == b"put under way"
    again.close()


def test_shards_whose_index_entries_were_lost_are_indexed_again_on_open(tmp_path: Path, kv: KVStore) -> None:
    """FAKE power cut: the index's log, copied as the disk holds it, cut back to its size at the last sync (no
    power can be cut here). The chunk's own bytes were synced before each put was acknowledged."""
    commits = GroupCommit(kv)
    chunk = make_chunk(tmp_path, kv, commits, 1)
    chunk.put_shard(1, chunk.chunk_id.vuid, b"indexed and synced")
    kv.sync_wal()
    wal = sorted(kv.path.glob("[0-9]*.log"))[-1]
    synced = wal.stat().st_size
    sizes = {bid: bid * 5000 for bid in range(2, 12)}
    for bid, size in sizes.items():
        chunk.put_shard(bid, chunk.chunk_id.vuid, bytes([bid]) * size)
    assert wal.stat().st_size > synced  # their entries are in the log, not synced
    image = tmp_path / "after-the-cut"
    shutil.copytree(kv.path, image)
    os.truncate(image / wal.name, synced)
    with KVStore(image, required_column_families()) as cut:
        assert ShardIndex(cut, chunk.chunk_id).get(5) is None  # the cut lost the entry
        again = ChunkFile.open(chunk.path, cut, chunk.chunk_id)
        assert again.read_shard(1) == b"indexed and synced"
        for bid, size in sizes.items():
            assert again.read_shard(bid) == bytes([bid]) * size
        assert again.stats().shard_count == 11
        again.close()
    chunk.close()
