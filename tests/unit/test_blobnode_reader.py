"""The background reader's view of a disk (services/blobnode/reader.py) beside the blobnode writing it: a real
disk (RocksDB primary and chunk files) written here, read through a RocksDB secondary as the reader process
does. A view behind the writer must never hand out wrong bytes: it catches up and answers what the disk holds."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore_server.libs.chunkfile import ShardCorrupted, ShardNotFound, ShardStatus
from blobstore_server.libs.proto.blobnode import ChunkStatus
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import ChunkNotFound, StaleEpoch
from blobstore_server.services.blobnode.disk import Disk
from blobstore_server.services.blobnode.reader import STALE_AFTER, DiskReader

VUID = Vuid.make(7, 2, 1)
PIECE = 64 << 10


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    written = Disk.load(tmp_path / "disk", cluster_id=1, disk_id=3, auto_format=True, max_chunks=8, sync=True,
                        io_threads=1)
    written.create_chunk(VUID, 64 << 20)
    try:
        yield written
    finally:
        written.close()


@pytest.fixture
def reader(disk: Disk) -> Iterator[DiskReader]:
    view = DiskReader(disk.path)
    try:
        yield view
    finally:
        view.close()


def shard(bid: int, size: int = 200_000) -> bytes:
    return bytes((bid * 7 + i) % 251 for i in range(size))


def read(reader: DiskReader, bid: int, offset: int = 0, size: int | None = None, vuid: int = VUID) -> bytes:
    meta, pieces, first = reader.open_read(vuid, bid, offset, size, PIECE)
    got = b"".join([first or b"", *pieces])
    assert meta.bid == bid
    return got


def test_reads_shards_written_before_and_after_it_opened(disk: Disk, reader: DiskReader) -> None:
    disk.put_shard(VUID, 1, shard(1))
    assert reader.disk_id == 3
    assert read(reader, 1) == shard(1)  # written after the view opened: found after a catch-up
    disk.put_shard(VUID, 2, shard(2))
    assert read(reader, 2, offset=70_000, size=100_000) == shard(2)[70_000:170_000]
    with pytest.raises(ShardNotFound):
        read(reader, 3)


def test_a_shard_deleted_behind_its_back_is_not_found_never_garbage(disk: Disk, reader: DiskReader) -> None:
    for bid in (1, 2):
        disk.put_shard(VUID, bid, shard(bid))
    assert read(reader, 1) == shard(1)  # the view now holds bid 1's index entry
    disk.shard_status(VUID, 1, ShardStatus.MARK_DELETED)
    disk.shard_status(VUID, 1, None)  # deleted for good: its blocks punched out
    with pytest.raises(ShardNotFound):
        read(reader, 1)
    assert read(reader, 2) == shard(2)


def test_compaction_and_release_behind_its_back(disk: Disk, reader: DiskReader) -> None:
    for bid in (1, 2, 3):
        disk.put_shard(VUID, bid, shard(bid))
    assert read(reader, 3) == shard(3)
    disk.shard_status(VUID, 1, ShardStatus.MARK_DELETED)
    disk.shard_status(VUID, 1, None)
    disk.compact_chunk(VUID)  # bid 3 moves to a new chunk file at another offset
    assert read(reader, 3) == shard(3)
    assert read(reader, 2) == shard(2)
    reader.catch_up()
    assert read(reader, 3) == shard(3)  # from the new chunk file
    with pytest.raises(ShardNotFound):
        read(reader, 1)
    disk.set_chunk_status(VUID, ChunkStatus.RELEASED)
    assert read(reader, 2) == shard(2)  # within STALE_AFTER of its last catch-up: the shard's own bytes still
    time.sleep(STALE_AFTER)
    with pytest.raises(ChunkNotFound):
        read(reader, 2)


def test_a_flipped_byte_on_disk_is_corruption_not_data(disk: Disk, reader: DiskReader) -> None:
    meta = disk.put_shard(VUID, 1, shard(1))
    record = disk.list_chunks()[0]
    fd = os.open(disk.path / "data" / record.chunk_id, os.O_RDWR)
    try:
        where = meta.offset + 100_000
        byte = os.pread(fd, 1, where)
        os.pwrite(fd, bytes([byte[0] ^ 0xFF]), where)
    finally:
        os.close(fd)
    with pytest.raises(ShardCorrupted):
        read(reader, 1)


def test_units_are_fenced_by_epoch(disk: Disk, reader: DiskReader) -> None:
    disk.put_shard(VUID, 1, shard(1))
    older, newer = Vuid.make(7, 2, 0), Vuid.make(7, 2, 2)
    with pytest.raises(StaleEpoch):
        read(reader, 1, vuid=older)
    with pytest.raises(ChunkNotFound):
        read(reader, 1, vuid=newer)
