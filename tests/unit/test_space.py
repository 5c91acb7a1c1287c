"""Volume space (libs/space.py) against what a real chunk file spends: the shards the real codec makes, written
into a real chunk file, move its write offset by exactly what a blob is charged, and a chunk of a volume's
capacity refuses the first shard past it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore_server.libs import space
from blobstore_server.libs.chunkfile import ChunkFile, ChunkFull, ChunkId, Vuid, required_column_families
from blobstore_server.libs.ec import CodeMode, codec_for, tactic
from blobstore_server.libs.kv import KVStore

VUID = Vuid.make(7, 0, 1)
MODES = [CodeMode.EC3P3, CodeMode.EC6P6, CodeMode.EC16P20L2, CodeMode.EC4P4L2]
# around the 2 KiB minimum shard, a page boundary of the framed shard, a 64 KiB block, and whole blobs
BLOB_LENGTHS = [1, 1024, 6144, 6145, 3 * 4052, 3 * 4053 + 1, 3 * 65536 + 7, 1 << 20, 4 << 20]


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[KVStore]:
    with KVStore(tmp_path / "meta", required_column_families()) as store:
        yield store


def chunk_in(tmp_path: Path, kv: KVStore, max_size: int | None = None) -> ChunkFile:
    cid = ChunkId.new(VUID)
    return ChunkFile.create(tmp_path / str(cid), kv, cid, sync=False, max_size=max_size)


def written(chunk: ChunkFile, mode: CodeMode, blobs: list[int], first_bid: int = 1) -> int:
    """How far the chunk's write offset moves for unit 0's shard of each blob, encoded by the real codec."""
    codec = codec_for(mode)
    before = chunk.stats().write_offset
    for bid, length in enumerate(blobs, first_bid):
        chunk.put_shard(bid, VUID, codec.encode(random.Random(bid).randbytes(length))[0])
    return chunk.stats().write_offset - before


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_blob_is_charged_what_its_shard_moves_a_real_chunk_file(tmp_path: Path, kv: KVStore,
                                                                  mode: CodeMode) -> None:
    chunk = chunk_in(tmp_path, kv)
    try:
        for bid, length in enumerate(BLOB_LENGTHS, 1):
            assert space.blob_bytes(mode, length) == written(chunk, mode, [length], bid), length
    finally:
        chunk.close()


def test_an_object_is_charged_its_blobs_exactly(tmp_path: Path, kv: KVStore) -> None:
    chunk = chunk_in(tmp_path, kv)
    try:
        blob_size = 1 << 20
        size = 3 * blob_size + 1000
        assert space.charge(CodeMode.EC3P3, size, blob_size) == written(chunk, CodeMode.EC3P3,
                                                                          [blob_size] * 3 + [1000])
        assert space.charge(CodeMode.EC3P3, 1024, 4 << 20) == 4096  # a 1 KiB object takes a page on each unit
        assert space.charge(CodeMode.EC3P3, 0, 4 << 20) == 0
    finally:
        chunk.close()


def test_a_volume_of_that_capacity_holds_what_its_charges_allow_and_no_more(tmp_path: Path, kv: KVStore) -> None:
    chunk_size = 1 << 20
    chunk = chunk_in(tmp_path, kv, max_size=chunk_size)
    capacity, used, bid = space.unit_capacity(chunk_size), 0, 0
    try:
        while used + space.charge(CodeMode.EC3P3, 1024, 4 << 20) <= capacity:
            bid += 1
            used += written(chunk, CodeMode.EC3P3, [1024], bid)
        with pytest.raises(ChunkFull):
            written(chunk, CodeMode.EC3P3, [1024], bid + 1)
    finally:
        chunk.close()
    assert bid == 255 and used == capacity  # the chunk is full exactly when the volume says so


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_what_a_grant_keeps_charged_covers_whatever_its_objects_took(mode: CodeMode) -> None:
    """A grant of `bids` bids sharing `size` bytes, used by objects of any sizes (one blob each, or several),
    then the rest given back: what stays charged is never less than what the objects' shards take."""
    rng = random.Random(int(mode))
    blob_size = 4 << 20
    for _ in range(300):
        bids, size = rng.randrange(1, 2000), rng.randrange(1, 64 << 20)
        taken: list[int] = []
        used_bids = 0
        while used_bids < bids and rng.random() < 0.97:
            length = min(size - sum(taken), rng.choice([1, 700, 2048 * tactic(mode).n + 1, rng.randrange(1, 1 << 20)]))
            blobs = -(-length // blob_size)
            if length <= 0 or used_bids + blobs > bids:
                break
            taken.append(length)
            used_bids += blobs
        took = sum(space.charge(mode, length, blob_size) for length in taken)
        kept = space.charge(mode, size, blob_size, bids) - space.refund(mode, size - sum(taken), bids - used_bids)
        assert kept >= took, (bids, size, taken)


def test_a_grant_of_small_objects_is_charged_close_to_their_pages() -> None:
    """64 objects of 1 KiB from a 64 KiB reservation of 64 bids take 64 pages a unit: kept within 10% of that."""
    kept = (space.charge(CodeMode.EC3P3, 64 << 10, 4 << 20, 64)
            - space.refund(CodeMode.EC3P3, 0, 0))
    assert 64 * 4096 <= kept < 64 * 4096 * 1.1
    unused = space.charge(CodeMode.EC3P3, 64 << 10, 4 << 20, 64) - space.refund(CodeMode.EC3P3, 64 << 10, 64)
    assert 0 <= unused <= 1  # an untouched grant comes back whole, but for the rounding


@pytest.mark.parametrize("mode", MODES)
def test_a_volume_is_full_once_the_largest_blob_no_longer_fits(mode: CodeMode) -> None:
    for length in BLOB_LENGTHS:
        room = space.blob_bytes(mode, length)
        assert not space.is_full(mode, room, length)
        assert space.is_full(mode, room - 1, length)
        assert not space.is_full(mode, room - 1, 1) or room - 1 < space.blob_bytes(mode, 1)
