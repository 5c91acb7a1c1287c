"""Pure parts of the chunk file: ids, layout arithmetic, header/shard framing."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from isal.isal_zlib import crc32

import blobstore_server.libs.chunkfile as chunkfile
from blobstore_server.libs.chunkfile import ChunkCorrupted, ChunkId, ShardCorrupted, Vuid
from blobstore_server.libs.chunkfile import format as fmt
from tests.support.chunk_records import version_1_header, version_1_shard_header


@given(st.integers(0, 2**32 - 1), st.integers(0, 255), st.integers(0, 2**24 - 1))
def test_vuid_fields_round_trip(vid: int, index: int, epoch: int) -> None:
    v = Vuid.make(vid, index, epoch)
    assert (v.vid(), v.index(), v.epoch()) == (vid, index, epoch)
    assert int(v) == vid << 32 | index << 24 | epoch
    assert Vuid(int(v)) == v


@pytest.mark.parametrize("args", [(-1, 0, 0), (2**32, 0, 0), (1, 256, 0), (1, 0, 2**24)])
def test_vuid_rejects_out_of_range(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        Vuid.make(*args)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_chunk_id_round_trips_bytes_and_text(vuid: int, ts: int) -> None:
    cid = ChunkId(vuid, ts)
    assert len(cid.to_bytes()) == 16
    assert ChunkId.from_bytes(cid.to_bytes()) == cid
    assert ChunkId.parse(str(cid)) == cid
    assert len(str(cid)) == 32


def test_chunk_id_bytes_sort_like_fields() -> None:
    ids = [ChunkId(2, 1), ChunkId(1, 5), ChunkId(1, 2**40), ChunkId(0, 2**63)]
    assert sorted(ids, key=ChunkId.to_bytes) == sorted(ids)
    with pytest.raises(ValueError):
        ChunkId.parse("00")


def test_layout_arithmetic() -> None:
    assert fmt.physical_size(0) == 4096
    assert fmt.encoded_size(1) == 32 + 4 + 1 + 8
    assert fmt.encoded_size(65536) == 32 + 4 + 65536 + 8
    assert fmt.encoded_size(65537) == 32 + 8 + 65537 + 8
    for size in (0, 1, 4055, 4056, 65536, 4 << 20):
        assert fmt.physical_size(size) % 4096 == 0
        assert fmt.physical_size(size) >= fmt.encoded_size(size)


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 200_000])
def test_encoded_shard_layout(size: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    data = data[:size]
    bufs, crc, phys = fmt.encode_shard(7, 9, memoryview(data), 0xABCD_1234)
    raw = b"".join(bytes(b) for b in bufs)
    assert len(raw) == phys == fmt.physical_size(size)
    assert crc == crc32(data)
    assert fmt.parse_shard_header(raw) == fmt.ShardHeader(bid=7, vuid=9, size=size, tag=0xABCD_1234)
    fmt.check_shard_header(raw, 7, 9, size, 0xABCD_1234, "test")
    for i in range(fmt.block_count(size)):
        pos = fmt.block_pos(i)
        block = raw[pos + 4:pos + 4 + fmt.block_len(size, i)]
        assert block == data[i * 65536:(i + 1) * 65536]
        assert fmt.unpack_crcs(raw[pos:pos + 4]) == (crc32(block),)
    fmt.check_footer(raw[fmt.footer_pos(size):], 7, crc, "test")
    with pytest.raises(ShardCorrupted):
        fmt.check_shard_header(raw, 8, 9, size, 0xABCD_1234, "test")  # names another bid
    with pytest.raises(ShardCorrupted, match="tag"):
        fmt.check_shard_header(raw, 7, 9, size, 0xABCD_1235, "test")  # a record of another chunk
    with pytest.raises(ShardCorrupted):
        fmt.check_footer(raw[fmt.footer_pos(size):], 7, crc ^ 1, "test")


def test_chunk_header_round_trip_and_damage() -> None:
    parent = ChunkId(5, 6)
    raw = fmt.ChunkHeader(parent=parent, ctime=123, tag=0xFEED_BEEF).pack()
    assert len(raw) == 4096
    assert fmt.ChunkHeader.unpack(raw) == fmt.ChunkHeader(parent=parent, ctime=123, tag=0xFEED_BEEF, version=2)
    assert fmt.ChunkHeader.unpack(fmt.ChunkHeader(parent=None, ctime=1, tag=1).pack()).parent is None
    for pos in (0, 4, 10, 25, 30, 34):  # magic, version, parent, ctime, tag, crc
        bad = bytearray(raw)
        bad[pos] ^= 0xFF
        with pytest.raises(ChunkCorrupted):
            fmt.ChunkHeader.unpack(bytes(bad))
    for short in (10, 35):
        with pytest.raises(ChunkCorrupted):
            fmt.ChunkHeader.unpack(raw[:short])


def test_a_new_chunk_tag_is_random_and_never_zero() -> None:
    tags = {fmt.new_tag() for _ in range(1000)}
    assert len(tags) > 990 and 0 not in tags
    assert all(0 < tag <= fmt.MAX_TAG for tag in tags)


def test_a_version_1_header_reads_untagged_and_packs_back_byte_for_byte() -> None:
    raw = version_1_header(ctime=77)
    header = fmt.ChunkHeader.unpack(raw)
    assert header == fmt.ChunkHeader(parent=None, ctime=77, tag=0, version=1)
    assert header.pack() == raw
    bad = bytearray(raw)
    bad[29] ^= 0xFF  # its crc
    with pytest.raises(ChunkCorrupted):
        fmt.ChunkHeader.unpack(bytes(bad))


def test_a_header_of_an_unknown_version_or_a_tagged_version_without_a_tag_is_refused() -> None:
    with pytest.raises(ChunkCorrupted, match="version 3"):
        fmt.ChunkHeader.unpack(fmt.ChunkHeader(parent=None, ctime=1, tag=5, version=3).pack())
    with pytest.raises(ChunkCorrupted, match="without a tag"):
        fmt.ChunkHeader.unpack(fmt.ChunkHeader(parent=None, ctime=1, tag=0).pack())


def test_a_version_1_shard_header_is_the_untagged_one() -> None:
    """Records of a version-1 chunk, on disk or still written into it, are the layout before the tag."""
    old = version_1_shard_header(7, 9, 1000)
    bufs, _, _ = fmt.encode_shard(7, 9, memoryview(bytes(1000)), 0)
    assert bytes(bufs[0]) == old
    assert fmt.parse_shard_header(old) == fmt.ShardHeader(7, 9, 1000, 0)
    fmt.check_shard_header(old, 7, 9, 1000, 0, "test")
    with pytest.raises(ShardCorrupted):
        fmt.check_shard_header(old, 7, 9, 1000, 1, "test")


def test_public_surface() -> None:
    for name in chunkfile.__all__:
        assert hasattr(chunkfile, name), name
    assert chunkfile.SHARD_CF in chunkfile.required_column_families()
    errors = [chunkfile.ShardNotFound, chunkfile.ShardExists, chunkfile.ShardCorrupted,
              chunkfile.ShardMarkDeleted, chunkfile.RangeError, chunkfile.ChunkFull,
              chunkfile.ChunkCorrupted, chunkfile.ChunkReadOnly, chunkfile.PunchHoleError]
    assert all(issubclass(e, chunkfile.ChunkError) for e in errors)
