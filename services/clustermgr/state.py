"""The clustermgr state machine: every committed Raft command is applied here, in order, on every node.

Deterministic by construction: a command carries the leader's clock (`now`) and every choice
(which disk, which vid) is made before proposing; applying only validates and writes. A refused
command changes nothing and yields the same typed error on every replica. Each command's writes
and the applied index go to RocksDB in one atomic batch.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from libs.ec import CodeMode, UnknownCodeMode, parse_code_mode, tactic
from libs.kv import Batch, KVStore
from libs.proto.cluster import (
    DISK_TRANSITIONS,
    DiskInfo,
    DiskStatus,
    ServiceInfo,
    Unit,
    VolumeInfo,
    VolumeStatus,
)
from libs.proto.ids import Vuid
from libs.rpc.errors import BadRequest, Conflict, NotFound, RpcError, error_from_response
from services.clustermgr.placement import Candidate, PlacementError, check_placement

DISK, VOLUME, SCOPE, SERVICE, CONFIG, KV, META = "disk", "volume", "scope", "service", "config", "kv", "meta"
DATA_CFS = (DISK, VOLUME, SCOPE, SERVICE, CONFIG, KV)
APPLIED_KEY = b"applied_index"
Result = dict[str, Any]


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


def encode_command(op: str, now: float, **args: Any) -> bytes:
    return json.dumps({"op": op, "now": now, "args": args}, separators=(",", ":")).encode()


def decode_result(raw: bytes) -> Any:
    """The proposer's side of `apply`: the result, or the typed error every replica agreed on."""
    answer = json.loads(raw)
    if "error" in answer:
        raise error_from_response(0, answer["error"])
    return answer["ok"]


class ClusterState:
    """Disks, volumes, scopes, services, config and a generic kv over one RocksDB."""

    def __init__(self, path: Path, *, sync: bool = True) -> None:
        self.path = path
        self._sync = sync
        self.kv = KVStore(path, [*DATA_CFS, META], sync=sync)
        self._checksum_cache: tuple[int, int] | None = None
        self._ops: dict[str, Callable[..., Any]] = {
            name.removeprefix("_op_"): getattr(self, name) for name in dir(self) if name.startswith("_op_")
        }

    def close(self) -> None:
        self.kv.close()

    # Raft state-machine protocol

    def applied_index(self) -> int:
        raw = self.kv.get(META, APPLIED_KEY)
        return int(raw) if raw else 0

    def apply(self, index: int, command: bytes) -> bytes:
        batch = self.kv.batch()
        try:
            cmd = json.loads(command)
            handler = self._ops.get(cmd.get("op", ""))
            if handler is None:
                raise BadRequest(f"unknown command {cmd.get('op')!r}")
            answer: Result = {"ok": handler(batch, float(cmd["now"]), **cmd["args"])}
        except RpcError as exc:
            batch = self.kv.batch()
            answer = {"error": exc.to_json()}
        except (ValueError, TypeError, KeyError) as exc:
            batch = self.kv.batch()
            answer = {"error": BadRequest(f"malformed command: {exc}").to_json()}
        batch.put(META, APPLIED_KEY, str(index).encode())
        self.kv.write(batch)
        return json.dumps(answer, separators=(",", ":")).encode()

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
        for _, raw in self.kv.items(DISK):
            yield DiskInfo.model_validate_json(raw)

    def volume(self, vid: int) -> VolumeInfo:
        raw = self.kv.get(VOLUME, _u32(vid))
        if raw is None:
            raise NotFound(f"no volume {vid}")
        return VolumeInfo.model_validate_json(raw)

    def has_volume(self, vid: int) -> bool:
        return self.kv.get(VOLUME, _u32(vid)) is not None

    def volumes(self) -> Iterator[VolumeInfo]:
        for _, raw in self.kv.items(VOLUME):
            yield VolumeInfo.model_validate_json(raw)

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

    def kv_list(self, prefix: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.kv.prefix_items(KV, prefix.encode())}

    # writes

    def _put_disk(self, batch: Batch, disk: DiskInfo) -> None:
        batch.put(DISK, _u32(disk.disk_id), disk.model_dump_json().encode())

    def _put_volume(self, batch: Batch, volume: VolumeInfo) -> None:
        batch.put(VOLUME, _u32(volume.vid), volume.model_dump_json().encode())

    def _op_scope_alloc(self, batch: Batch, now: float, name: str, count: int) -> Result:
        if not 1 <= count <= 1 << 32:
            raise BadRequest(f"scope count must be in 1..2^32, got {count}")
        start = self.scope(name) + 1
        batch.put(SCOPE, name.encode(), str(start + count - 1).encode())
        return {"name": name, "start": start, "end": start + count - 1}

    def _op_disk_add(self, batch: Batch, now: float, disk: dict[str, Any]) -> Result:
        info = DiskInfo.model_validate({**disk, "last_heartbeat": now})
        if info.disk_id > self.scope("disk_id"):
            raise BadRequest(f"disk id {info.disk_id} was never allocated; use /disk/alloc_id")
        if self.kv.get(DISK, _u32(info.disk_id)) is not None:
            raise Conflict(f"disk id {info.disk_id} is already registered")
        self._put_disk(batch, info)
        return info.model_dump()

    def _op_disk_heartbeat(self, batch: Batch, now: float, disks: list[dict[str, Any]]) -> Result:
        updated = []
        for beat in disks:
            info = self.disk(int(beat["disk_id"]))
            info = info.model_copy(update={"size": int(beat["size"]), "free": int(beat["free"]),
                                           "chunks": int(beat.get("chunks", info.chunks)), "last_heartbeat": now})
            self._put_disk(batch, info)
            updated.append(info.disk_id)
        return {"disks": updated}

    def _op_disk_set(self, batch: Batch, now: float, disk_id: int, status: str | None = None,
                     readonly: bool | None = None) -> Result:
        info = self.disk(disk_id)
        if status is not None:
            new = DiskStatus(status)
            if new != info.status and new not in DISK_TRANSITIONS[info.status]:
                raise Conflict(f"disk {disk_id} cannot go from {info.status} to {new}")
            info.status = new
        if readonly is not None:
            info.readonly = readonly
        self._put_disk(batch, info)
        return info.model_dump()

    def _op_volume_create(self, batch: Batch, now: float, vid: int, code_mode: int, backend: str,
                          units: list[dict[str, Any]], capacity: int) -> Result:
        try:
            mode = parse_code_mode(code_mode)
        except UnknownCodeMode as exc:
            raise BadRequest(str(exc)) from None
        if vid > self.scope("vid"):
            raise BadRequest(f"vid {vid} was never allocated")
        if self.kv.get(VOLUME, _u32(vid)) is not None:
            raise Conflict(f"volume {vid} already exists")
        unit_list = [Unit.model_validate(u) for u in units]
        disks = [self.disk(u.disk_id) for u in unit_list]
        try:
            check_placement(tactic(mode), [Candidate(d.disk_id, d.host, d.idc, d.rack, d.free) for d in disks])
        except PlacementError as exc:
            raise Conflict(f"volume {vid} placement refused: {exc}") from None
        for index, unit in enumerate(unit_list):
            if Vuid(unit.vuid).vid() != vid or Vuid(unit.vuid).index() != index:
                raise BadRequest(f"unit {index} has vuid {unit.vuid} that does not name volume {vid}/{index}")
        for disk in disks:
            self._put_disk(batch, disk.model_copy(update={"chunks": disk.chunks + 1}))
        volume = VolumeInfo(vid=vid, code_mode=int(mode), backend=backend, units=unit_list, capacity=capacity)
        self._put_volume(batch, volume)
        return volume.model_dump()

    def _op_volume_alloc(self, batch: Batch, now: float, code_mode: int, holder: str, count: int,
                         lease_ttl: float, min_free: int = 1) -> Result:
        """Lease up to `count` idle (or lapsed) volumes of a mode to `holder`."""
        mode = CodeMode(code_mode)
        leased = []
        for volume in self.volumes():
            if len(leased) >= count:
                break
            lapsed = volume.status is VolumeStatus.ACTIVE and volume.lease_expiry < now
            if volume.code_mode != mode or volume.free < min_free:
                continue
            if volume.status is VolumeStatus.IDLE or lapsed:
                volume = volume.model_copy(update={"status": VolumeStatus.ACTIVE, "lease_holder": holder,
                                                   "lease_expiry": now + lease_ttl})
                self._put_volume(batch, volume)
                leased.append(volume.model_dump())
        return {"volumes": leased}

    def _leased(self, vid: int, holder: str, now: float) -> VolumeInfo:
        volume = self.volume(vid)
        if volume.status is not VolumeStatus.ACTIVE or volume.lease_holder != holder:
            raise Conflict(f"volume {vid} is not leased to {holder!r} (status {volume.status},"
                           f" holder {volume.lease_holder!r})")
        if volume.lease_expiry < now:
            raise Conflict(f"the lease of volume {vid} by {holder!r} lapsed; lease it anew")
        return volume

    def _op_volume_retain(self, batch: Batch, now: float, holder: str, lease_ttl: float,
                          volumes: list[dict[str, int]]) -> Result:
        retained, refused = [], []
        for item in volumes:
            try:
                volume = self._leased(int(item["vid"]), holder, now)
            except (Conflict, NotFound) as exc:
                refused.append({"vid": item["vid"], "reason": exc.message})
                continue
            used = max(volume.used, int(item.get("used", volume.used)))
            self._put_volume(batch, volume.model_copy(update={"lease_expiry": now + lease_ttl, "used": used}))
            retained.append({"vid": volume.vid, "lease_expiry": now + lease_ttl})
        return {"retained": retained, "refused": refused}

    def _op_volume_release(self, batch: Batch, now: float, vid: int, holder: str) -> Result:
        volume = self.volume(vid)
        if volume.status is VolumeStatus.ACTIVE and volume.lease_holder == holder:
            volume = volume.model_copy(update={"status": VolumeStatus.IDLE, "lease_holder": "", "lease_expiry": 0.0})
            self._put_volume(batch, volume)
        return volume.model_dump()

    def _op_volume_lock(self, batch: Batch, now: float, vid: int) -> Result:
        volume = self.volume(vid)
        volume = volume.model_copy(update={"status": VolumeStatus.LOCK, "lease_holder": "", "lease_expiry": 0.0})
        self._put_volume(batch, volume)
        return volume.model_dump()

    def _op_volume_unlock(self, batch: Batch, now: float, vid: int) -> Result:
        volume = self.volume(vid)
        if volume.status is not VolumeStatus.LOCK:
            raise Conflict(f"volume {vid} is {volume.status}, not locked")
        if volume.pending_units:
            raise Conflict(f"volume {vid} still moves units {sorted(volume.pending_units)}")
        volume = volume.model_copy(update={"status": VolumeStatus.IDLE})
        self._put_volume(batch, volume)
        return volume.model_dump()

    def _op_volume_unit_alloc(self, batch: Batch, now: float, vid: int, index: int, disk_id: int) -> Result:
        """Reserve a new chunk location for unit `index`: the same unit with epoch + 1."""
        volume = self.volume(vid)
        if not 0 <= index < len(volume.units):
            raise BadRequest(f"volume {vid} has no unit {index}")
        disk = self.disk(disk_id)
        if not disk.writable:
            raise Conflict(f"disk {disk_id} cannot take a unit (status {disk.status}, readonly {disk.readonly})")
        others = [u for i, u in enumerate(volume.units) if i != index]
        if any(u.disk_id == disk_id for u in others):
            raise Conflict(f"disk {disk_id} already holds a unit of volume {vid}")
        current = Vuid(volume.units[index].vuid)
        pending = volume.pending_units.get(index)
        epoch = max(current.epoch(), Vuid(pending.vuid).epoch() if pending else 0) + 1
        unit = Unit(vuid=Vuid.make(vid, index, epoch), disk_id=disk_id, host=disk.host)
        volume.pending_units[index] = unit
        self._put_volume(batch, volume)
        return unit.model_dump()

    def _op_volume_unit_update(self, batch: Batch, now: float, vid: int, index: int, vuid: int, disk_id: int) -> Result:
        """Commit a moved unit; only the newest reserved epoch for that unit is accepted."""
        volume = self.volume(vid)
        pending = volume.pending_units.get(index)
        current = volume.units[index] if 0 <= index < len(volume.units) else None
        if current is None:
            raise BadRequest(f"volume {vid} has no unit {index}")
        if pending is None or pending.vuid != vuid or pending.disk_id != disk_id:
            raise Conflict(f"unit {index} of volume {vid}: vuid {vuid} on disk {disk_id} is not the reserved move"
                           f" (current epoch {Vuid(current.vuid).epoch()})")
        volume.units[index] = pending
        del volume.pending_units[index]
        self._put_volume(batch, volume)
        new_disk = self.disk(disk_id)
        self._put_disk(batch, new_disk.model_copy(update={"chunks": new_disk.chunks + 1}))
        return volume.model_dump()

    def _op_service_register(self, batch: Batch, now: float, name: str, host: str, idc: str = "",
                             ttl: float = 30.0) -> Result:
        info = ServiceInfo(name=name, host=host, idc=idc, last_heartbeat=now, ttl=ttl)
        batch.put(SERVICE, f"{name}/{host}".encode(), info.model_dump_json().encode())
        return info.model_dump()

    def _op_service_heartbeat(self, batch: Batch, now: float, name: str, host: str) -> Result:
        raw = self.kv.get(SERVICE, f"{name}/{host}".encode())
        if raw is None:
            raise NotFound(f"service {name} at {host} is not registered")
        info = ServiceInfo.model_validate_json(raw).model_copy(update={"last_heartbeat": now})
        batch.put(SERVICE, f"{name}/{host}".encode(), info.model_dump_json().encode())
        return info.model_dump()

    def _op_service_unregister(self, batch: Batch, now: float, name: str, host: str) -> Result:
        batch.delete(SERVICE, f"{name}/{host}".encode())
        return {"name": name, "host": host}

    def _op_config_set(self, batch: Batch, now: float, key: str, value: str) -> Result:
        batch.put(CONFIG, key.encode(), value.encode())
        return {"key": key, "value": value}

    def _op_config_delete(self, batch: Batch, now: float, key: str) -> Result:
        batch.delete(CONFIG, key.encode())
        return {"key": key}

    def _op_kv_set(self, batch: Batch, now: float, key: str, value: str) -> Result:
        batch.put(KV, key.encode(), value.encode())
        return {"key": key, "value": value}

    def _op_kv_delete(self, batch: Batch, now: float, key: str) -> Result:
        batch.delete(KV, key.encode())
        return {"key": key}

    def _op_kv_cas(self, batch: Batch, now: float, key: str, expected: str | None, value: str | None) -> Result:
        """Set (or delete, value None) `key` only if it currently equals `expected` (None: absent)."""
        current = self.kv_get(key)
        if current != expected:
            raise Conflict(f"kv {key!r} is {current!r}, expected {expected!r}")
        if value is None:
            batch.delete(KV, key.encode())
        else:
            batch.put(KV, key.encode(), value.encode())
        return {"key": key, "value": value}
