"""One disk's shard index and chunk list written as Parquet for the offline inspection (spark/inspect.py), in the
layout and schemas of libs/proto/export.py.

Every method blocks and does a bounded amount of work, so the caller runs each as a separate background
operation of the disk (its capped lane): user I/O never waits behind an export.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from blobstore_server.libs.chunkfile import ShardStatus
from blobstore_server.libs.proto.blobnode import ChunkInfo, DiskExport
from blobstore_server.libs.proto.export import CHUNK_SCHEMA, SHARD_SCHEMA, chunk_path, manifest_path, shard_path
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import ChunkNotFound
from blobstore_server.services.blobnode.disk import Disk

INDEX_ENTRY_BYTES = 64  # what one exported index entry reads (key and value), charged to the background rate


@dataclass
class DiskExporter:
    disk: Disk
    filesystem: pafs.FileSystem
    base: str
    host: str
    piece_rows: int
    started: float = field(default_factory=time.time)
    rows: int = 0
    _chunks: list[ChunkInfo] = field(default_factory=list)
    _todo: list[ChunkInfo] = field(default_factory=list)
    _next_bid: int = 0
    _writer: pq.ParquetWriter | None = None

    @property
    def shard_file(self) -> str:
        return shard_path(self.disk.disk_id)

    @property
    def chunk_file(self) -> str:
        return chunk_path(self.disk.disk_id)

    def _path(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def begin(self) -> None:
        """Drop the old manifest (a re-export reads as unavailable until it is done) and list the chunks."""
        for folder in ("shards", "chunks", "manifests"):
            self.filesystem.create_dir(self._path(folder), recursive=True)
        with contextlib.suppress(FileNotFoundError):
            self.filesystem.delete_file(self._path(manifest_path(self.disk.disk_id)))
        self._chunks = self.disk.list_chunks()
        self._todo = list(self._chunks)
        self._writer = pq.ParquetWriter(self._path(self.shard_file), SHARD_SCHEMA, filesystem=self.filesystem)

    @property
    def done(self) -> bool:
        """Every chunk listed by `begin` is exported."""
        return not self._todo

    def step(self) -> int:
        """Export up to `piece_rows` index entries as one row group; how many it exported."""
        columns: dict[str, list[int | bool]] = {name: [] for name in SHARD_SCHEMA.names}
        while self._todo and len(columns["bid"]) < self.piece_rows:
            record, want = self._todo[0], self.piece_rows - len(columns["bid"])
            try:
                metas = self.disk.read_chunk(record.vuid).list_shards(self._next_bid, want)
            except ChunkNotFound:  # released meanwhile: nothing of it is live any more
                metas = []
            vuid = Vuid(record.vuid)
            for meta in metas:
                for name, value in (("disk_id", self.disk.disk_id), ("vid", vuid.vid()),
                                    ("unit_index", vuid.index()), ("epoch", vuid.epoch()), ("bid", meta.bid),
                                    ("size", meta.size), ("crc", meta.crc),
                                    ("deleted", meta.status is ShardStatus.MARK_DELETED),
                                    ("written_at", meta.written_at), ("marked_at", meta.marked_at)):
                    columns[name].append(value)
            if len(metas) < want:
                self._todo.pop(0)
                self._next_bid = 0
            else:
                self._next_bid = metas[-1].bid + 1
        if columns["bid"]:
            assert self._writer is not None
            self._writer.write_table(pa.table(columns, schema=SHARD_SCHEMA))
            self.rows += len(columns["bid"])
        return len(columns["bid"])

    def finish(self) -> DiskExport:
        """Close the shard file, write the chunk list, then the manifest: from now on the export counts."""
        assert self._writer is not None
        self._writer.close()
        vuids = [Vuid(c.vuid) for c in self._chunks]
        chunks = pa.table({"disk_id": [self.disk.disk_id] * len(vuids), "vid": [v.vid() for v in vuids],
                           "unit_index": [v.index() for v in vuids], "epoch": [v.epoch() for v in vuids],
                           "chunk_id": [c.chunk_id for c in self._chunks],
                           "status": [c.status.value for c in self._chunks],
                           "created": [c.created for c in self._chunks]}, schema=CHUNK_SCHEMA)
        pq.write_table(chunks, self._path(self.chunk_file), filesystem=self.filesystem)
        manifest = DiskExport(disk_id=self.disk.disk_id, host=self.host, started=self.started, finished=time.time(),
                              shard_file=self.shard_file, shards=self.rows, chunk_file=self.chunk_file,
                              chunks=len(self._chunks))
        with self.filesystem.open_output_stream(self._path(manifest_path(self.disk.disk_id))) as out:
            out.write(manifest.model_dump_json().encode())
        return manifest

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
