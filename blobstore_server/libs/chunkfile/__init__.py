"""Chunk files: shards with per-64 KiB-block CRCs, a KV shard index, punch-hole delete, compaction."""

from blobstore_server.libs.chunkfile.chunk import ChunkFile, ChunkStats
from blobstore_server.libs.chunkfile.commit import GroupCommit, StagedPut
from blobstore_server.libs.chunkfile.errors import (
    ChunkCorrupted,
    ChunkError,
    ChunkFull,
    ChunkReadOnly,
    CrcMismatch,
    PunchHoleError,
    RangeError,
    ShardCorrupted,
    ShardExists,
    ShardHeld,
    ShardMarkDeleted,
    ShardNotFound,
    ShardNotMarkDeleted,
)
from blobstore_server.libs.chunkfile.format import ALIGN, BLOCK_SIZE, CHUNK_HEADER_SIZE, physical_size
from blobstore_server.libs.chunkfile.index import SHARD_CF, ShardMeta, ShardStatus, required_column_families
from blobstore_server.libs.proto.ids import ChunkId, Vuid

__all__ = [
    "ALIGN",
    "BLOCK_SIZE",
    "CHUNK_HEADER_SIZE",
    "SHARD_CF",
    "ChunkCorrupted",
    "ChunkError",
    "ChunkFile",
    "ChunkFull",
    "ChunkId",
    "ChunkReadOnly",
    "ChunkStats",
    "CrcMismatch",
    "GroupCommit",
    "PunchHoleError",
    "RangeError",
    "ShardCorrupted",
    "ShardExists",
    "ShardHeld",
    "ShardMarkDeleted",
    "ShardMeta",
    "ShardNotFound",
    "ShardNotMarkDeleted",
    "ShardStatus",
    "StagedPut",
    "Vuid",
    "physical_size",
    "required_column_families",
]
