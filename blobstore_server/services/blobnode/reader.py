"""One disk as the background reader process sees it (services/blobnode/reader_app.py): read-only, beside the
blobnode process that writes it.

The shard index is the disk's RocksDB opened as a secondary, which sees the primary's writes as of its last
catch-up; chunk files are opened read-only. A view that is behind can only miss (a shard or chunk it has not
seen yet) or point at bytes that changed under it (a shard deleted for good since: its blocks punched out, so
they fail their CRCs); either way the read is tried once more after a catch-up, which sees every write the
blobnode acknowledged before it; and a view is caught up at least every `STALE_AFTER` seconds it is used. A
chunk compacted away stays readable through the descriptor held here: its bytes, valid CRCs and all, are the
shard's. Every method blocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

from blobstore_server.libs.chunkfile import ChunkError, ChunkFile, ChunkId, ShardMeta, required_column_families
from blobstore_server.libs.kv import KVStore
from blobstore_server.libs.proto.blobnode import ChunkInfo, ChunkStatus
from blobstore_server.libs.rpc.errors import ChunkNotFound, StaleEpoch
from blobstore_server.services.blobnode.disk import CHUNK_CF, check_epoch, read_format, unit_key

# Seconds a view may lag the blobnode without a miss: what it may still serve of a unit released meanwhile (the
# right bytes of its shards: they never change, and the chunk file stays open here).
STALE_AFTER = 1.0
# A miss that may only mean the view is behind the blobnode.
_BEHIND = (ChunkError, ChunkNotFound, StaleEpoch)
Opened = tuple[ShardMeta, Iterator[memoryview], memoryview | None]


class DiskReader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.disk_id = read_format(path).disk_id
        own = path / ".sys" / "reader"  # the secondary's own logs
        own.mkdir(parents=True, exist_ok=True)
        self.kv = KVStore(path / "meta", [CHUNK_CF, *required_column_families()], secondary=own)
        self._lock = threading.Lock()  # one catch-up at a time
        self._chunks: dict[bytes, tuple[ChunkInfo, ChunkFile]] = {}
        self._caught_up = -STALE_AFTER
        self.catch_up()

    def close(self) -> None:
        with self._lock:
            for _, chunk in self._chunks.values():
                chunk.close()
            self._chunks.clear()
            self.kv.close()

    def catch_up(self, unless_within: float = 0.0) -> None:
        """See the blobnode's writes so far: the index, and the chunks created, compacted or released (unless the
        last catch-up is less than `unless_within` seconds old). It costs ~2 ms, so it is done on a miss, and at
        most every `STALE_AFTER` seconds otherwise."""
        with self._lock:
            if time.monotonic() - self._caught_up < unless_within:
                return
            self.kv.catch_up()
            self._caught_up = time.monotonic()
            chunks: dict[bytes, tuple[ChunkInfo, ChunkFile]] = {}
            for key, raw in self.kv.items(CHUNK_CF):
                record = ChunkInfo.model_validate_json(raw)
                if record.status is ChunkStatus.RELEASED:
                    continue
                held = self._chunks.get(key)
                if held is not None and held[0].chunk_id == record.chunk_id:
                    chunks[key] = (record, held[1])
                    continue
                try:
                    chunk = ChunkFile.open_readonly(self.path / "data" / record.chunk_id, self.kv,
                                                    ChunkId.parse(record.chunk_id))
                except FileNotFoundError:  # released or compacted away since the catch-up: the next one sees it
                    continue
                chunks[key] = (record, chunk)
            kept = {id(chunk) for _, chunk in chunks.values()}
            gone = [chunk for _, chunk in self._chunks.values() if id(chunk) not in kept]
            self._chunks = chunks
        for chunk in gone:
            chunk.close()  # waits for reads of it under way

    def _chunk(self, vuid: int) -> ChunkFile:
        held = self._chunks.get(unit_key(vuid))
        if held is None:
            raise ChunkNotFound(f"disk {self.disk_id} has no chunk for vuid {vuid}")
        check_epoch(held[0], vuid, self.disk_id)
        return held[1]

    def open_read(self, vuid: int, bid: int, offset: int, size: int | None, piece: int) -> Opened:
        """(meta, pieces, first piece) of a shard's range, its CRCs checked as it is read; a miss is tried again
        after a catch-up."""
        self.catch_up(unless_within=STALE_AFTER)
        try:
            return self._open_read(vuid, bid, offset, size, piece)
        except _BEHIND:
            self.catch_up()
            return self._open_read(vuid, bid, offset, size, piece)

    def _open_read(self, vuid: int, bid: int, offset: int, size: int | None, piece: int) -> Opened:
        chunk = self._chunk(vuid)
        meta = chunk.stat_shard(bid)
        pieces = chunk.iter_shard(bid, offset, size, piece=piece, direct=True)
        return meta, pieces, next(pieces, None)
