"""The clustermgr state machine's storage: what every committed Raft command wrote, in order, on every node
(`machine.py` applies them, `commands/` says what each does), and fresh reads are served from here.

A refused command changes nothing and yields the same typed error on every replica. Each command's
writes, its client session's bookkeeping (`sessions.py`) and the applied index go to RocksDB in one
atomic batch.

Disks and volumes are also held parsed in memory (`Parsed`), for the scans: a volume allocation, a /metrics
scrape or a listing walks every volume, which would otherwise parse every record's JSON each time (~8 us
each: 80 ms per scan at 10,000 volumes, inside the apply loop for an allocation).
"""

from __future__ import annotations

import itertools
import shutil
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel

from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.cluster import DiskInfo, ServiceInfo, VolumeInfo
from blobstore_server.libs.proto.clustermgr import UNDELETE_PREFIX, UndeleteRecord
from blobstore_server.libs.rpc.errors import NotFound
from blobstore_server.services.clustermgr import sessions

DISK, VOLUME, SCOPE, SERVICE, CONFIG, KV, META = "disk", "volume", "scope", "service", "config", "kv", "meta"
DATA_CFS = (DISK, VOLUME, SCOPE, SERVICE, CONFIG, KV, sessions.CF)
APPLIED_KEY = b"applied_index"


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


M = TypeVar("M", bound=BaseModel)


class Parsed(Generic[M]):
    """Every record of one column family keyed by a u32, parsed once and kept in key order, with its revision:
    the Raft index of the command that last wrote it (for records loaded from disk, the index applied then,
    an upper bound), so a reader can ask for what changed after a revision it saw.

    A record enters only once the batch that writes it is written (`Batch.on_written`), parsed from the
    bytes written, so the view equals the store: a refused command's batch, and whatever its code did to
    the objects it read, never shows. Scans hand out the held objects; they are read-only."""

    def __init__(self, model: type[M], items: Iterable[tuple[bytes, bytes]], revision: int) -> None:
        self._model = model
        self._records = {int.from_bytes(key, "big"): model.model_validate_json(raw) for key, raw in items}
        self._revisions = dict.fromkeys(self._records, revision)

    def put(self, batch: Batch, cf: str, key: int, record: M, revision: int) -> None:
        raw = record.model_dump_json().encode()
        batch.put(cf, _u32(key), raw)
        batch.on_written(lambda: self._hold(key, self._model.model_validate_json(raw), revision))

    def _hold(self, key: int, record: M, revision: int) -> None:
        in_order = key in self._records or not self._records or key > next(reversed(self._records))
        self._records[key] = record
        self._revisions[key] = revision
        if not in_order:
            self._records = dict(sorted(self._records.items()))

    def __iter__(self) -> Iterator[M]:
        return iter(list(self._records.values()))

    def changed_since(self, revision: int) -> Iterator[M]:
        """The records written after `revision`, in key order (every record for 0)."""
        return iter([record for key, record in self._records.items() if self._revisions[key] > revision])


class ClusterState:
    """Disks, volumes, scopes, services, config and a generic kv over one RocksDB."""

    def __init__(self, path: Path, *, sync: bool = True) -> None:
        self.path = path
        self._sync = sync
        self.kv = KVStore(path, [*DATA_CFS, META], sync=sync)
        self._checksum_cache: tuple[int, int] | None = None
        self._load()

    def _load(self) -> None:
        self.applying = self.applied_index()  # the index of the command being applied (ClusterMachine sets it)
        self._disks = Parsed(DiskInfo, self.kv.items(DISK), self.applying)
        self._volumes = Parsed(VolumeInfo, self.kv.items(VOLUME), self.applying)

    def close(self) -> None:
        self.kv.close()

    # Raft state-machine protocol

    def applied_index(self) -> int:
        raw = self.kv.get(META, APPLIED_KEY)
        return int(raw) if raw else 0

    def snapshot(self, dest: Path) -> None:
        self.kv.checkpoint(dest)

    def restore(self, src: Path | None) -> None:
        """Replace the whole state with a snapshot's, or with the empty state (None)."""
        self.kv.close()
        shutil.rmtree(self.path, ignore_errors=True)
        if src is not None:
            shutil.copytree(src, self.path)
        self.kv = KVStore(self.path, [*DATA_CFS, META], sync=self._sync)
        self._checksum_cache = None
        self._load()

    def checksum(self) -> int:
        """CRC32 over every data record in key order: equal on replicas at the same applied index."""
        index = self.applied_index()
        if self._checksum_cache and self._checksum_cache[0] == index:
            return self._checksum_cache[1]
        crc = 0
        for cf in DATA_CFS:
            for key, value in self.kv.items(cf):
                crc = zlib.crc32(value, zlib.crc32(key, zlib.crc32(cf.encode(), crc)))
        self._checksum_cache = (index, crc)
        return crc

    # reads (local; the service layer makes them linearizable with read-index first)

    def disk(self, disk_id: int) -> DiskInfo:
        raw = self.kv.get(DISK, _u32(disk_id))
        if raw is None:
            raise NotFound(f"no disk {disk_id}")
        return DiskInfo.model_validate_json(raw)

    def disks(self) -> Iterator[DiskInfo]:
        """Every disk in id order (held parsed: read-only)."""
        return iter(self._disks)

    def volume(self, vid: int) -> VolumeInfo:
        raw = self.kv.get(VOLUME, _u32(vid))
        if raw is None:
            raise NotFound(f"no volume {vid}")
        return VolumeInfo.model_validate_json(raw)

    def has_volume(self, vid: int) -> bool:
        return self.kv.get(VOLUME, _u32(vid)) is not None

    def volumes(self) -> Iterator[VolumeInfo]:
        """Every volume in vid order (held parsed: read-only)."""
        return iter(self._volumes)

    def volumes_changed_since(self, revision: int) -> Iterator[VolumeInfo]:
        """The volumes written by commands applied after index `revision`, in vid order (held parsed: read-only).
        Volumes are never deleted, so these are all a reader that saw the state at `revision` lacks."""
        return self._volumes.changed_since(revision)

    def scope(self, name: str) -> int:
        raw = self.kv.get(SCOPE, name.encode())
        return int(raw) if raw else 0

    def services(self, name: str | None = None) -> Iterator[ServiceInfo]:
        prefix = f"{name}/".encode() if name else b""
        for _, raw in self.kv.prefix_items(SERVICE, prefix):
            yield ServiceInfo.model_validate_json(raw)

    def config(self, key: str) -> str | None:
        raw = self.kv.get(CONFIG, key.encode())
        return raw.decode() if raw is not None else None

    def configs(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.kv.items(CONFIG)}

    def kv_get(self, key: str) -> str | None:
        raw = self.kv.get(KV, key.encode())
        return raw.decode() if raw is not None else None

    def kv_list(self, prefix: str, after: str = "", limit: int | None = None) -> dict[str, str]:
        """Keys under `prefix` in order, past `after`, at most `limit` of them."""
        items = self.kv.prefix_items(KV, prefix.encode(), after.encode())
        return {k.decode(): v.decode() for k, v in itertools.islice(items, limit)}

    def undelete_records(self, vid: int | None = None) -> dict[str, UndeleteRecord]:
        """The undelete records kept (of volume `vid`), by their kv key."""
        prefix = UNDELETE_PREFIX if vid is None else f"{UNDELETE_PREFIX}{vid}/"
        return {key: UndeleteRecord.model_validate_json(raw) for key, raw in self.kv_list(prefix).items()}

    def undeleted_at(self, vid: int, bid: int) -> float | None:
        """When blob vid/bid was last undeleted, by the records kept (a volume holds few: a scan of its own)."""
        return max((record.at for key, record in self.undelete_records(vid).items()
                    if (low := int(key.rsplit("/", 1)[1])) <= bid < low + record.count), default=None)

    def sessions(self) -> int:
        return sessions.count(self.kv)

    def has_disk(self, disk_id: int) -> bool:
        return self.kv.get(DISK, _u32(disk_id)) is not None

    def service(self, name: str, host: str) -> ServiceInfo:
        raw = self.kv.get(SERVICE, f"{name}/{host}".encode())
        if raw is None:
            raise NotFound(f"service {name} at {host} is not registered")
        return ServiceInfo.model_validate_json(raw)

    # writes, into the batch of the command being applied (commands/)

    def put_scope(self, batch: Batch, name: str, last: int) -> None:
        batch.put(SCOPE, name.encode(), str(last).encode())

    def put_disk(self, batch: Batch, disk: DiskInfo) -> None:
        self._disks.put(batch, DISK, disk.disk_id, disk, self.applying)

    def put_volume(self, batch: Batch, volume: VolumeInfo) -> None:
        self._volumes.put(batch, VOLUME, volume.vid, volume, self.applying)

    def put_service(self, batch: Batch, info: ServiceInfo) -> None:
        batch.put(SERVICE, f"{info.name}/{info.host}".encode(), info.model_dump_json().encode())

    def delete_service(self, batch: Batch, name: str, host: str) -> None:
        batch.delete(SERVICE, f"{name}/{host}".encode())

    def put_config(self, batch: Batch, key: str, value: str | None) -> None:
        """Set a config key, or delete it (None)."""
        self._put_text(batch, CONFIG, key, value)

    def put_kv(self, batch: Batch, key: str, value: str | None) -> None:
        """Set a kv key, or delete it (None)."""
        self._put_text(batch, KV, key, value)

    @staticmethod
    def _put_text(batch: Batch, cf: str, key: str, value: str | None) -> None:
        if value is None:
            batch.delete(cf, key.encode())
        else:
            batch.put(cf, key.encode(), value.encode())
