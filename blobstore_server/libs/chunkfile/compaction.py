"""What compaction moves: every indexed shard of a chunk copied into a new one, then all their index entries in one
batch (`ChunkFile.compact_into` stops the writes and owns both chunks meanwhile)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from blobstore_server.libs.kv import Batch, KVStore

from . import format as fmt
from .errors import ShardCorrupted
from .index import ShardIndex, ShardMeta
from .reads import Read, ShardReader

Append = Callable[[list[memoryview | bytes], int], int]  # writes a shard's encoded bytes, answers their offset


def copy_shards(reader: ShardReader, metas: Iterable[ShardMeta], tag: int, append: Append) -> list[ShardMeta]:
    """Each shard re-verified while read (past the page cache), encoded with `tag` (the new chunk's) and written by
    `append`: the entries of the copies, neither synced nor indexed yet."""
    moved: list[ShardMeta] = []
    for meta in metas:
        data = reader.read_range(meta, 0, meta.size, Read.DIRECT)
        bufs, crc, phys = fmt.encode_shard(meta.bid, meta.vuid, data, tag)
        if crc != meta.crc:
            raise ShardCorrupted(f"bid {meta.bid}: shard crc mismatch against the index")
        moved.append(replace(meta, offset=append(bufs, phys)))
    return moved


def move_index(kv: KVStore, moved: list[ShardMeta], source: ShardIndex, target: ShardIndex,
               before_commit: Callable[[Batch], None] | None) -> None:
    """One batch moves the entries of `moved` from `source` to `target` and drops the source's watermark, with
    whatever `before_commit` adds."""
    batch = kv.batch()
    for meta in moved:
        target.put_into(batch, meta)
        source.delete_into(batch, meta.bid)
    source.watermark_into(batch, None)
    if before_commit is not None:
        before_commit(batch)
    kv.write(batch)
