"""Keyed records: id scopes, config, the kv store and its undelete records."""

from __future__ import annotations

from blobstore_server.libs.kv import Batch
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.clustermgr import (
    KeyRef,
    KeyValue,
    MaybeValue,
    ScopeRange,
    UndeleteRecord,
    UndeleteTaken,
    undelete_key,
)
from blobstore_server.libs.proto.scheduler import LEADER_KEY, LeaderRecord
from blobstore_server.libs.rpc.errors import BadRequest, Conflict
from blobstore_server.services.clustermgr.commands.table import Command, command
from blobstore_server.services.clustermgr.state import ClusterState


class ScopeAlloc(api.ScopeAlloc, Command[ScopeRange]):
    op = "scope_alloc"


@command(ScopeAlloc)
def scope_alloc(s: ClusterState, batch: Batch, now: float, cmd: ScopeAlloc) -> ScopeRange:
    start = s.scope(cmd.name) + 1
    s.put_scope(batch, cmd.name, start + cmd.count - 1)
    return ScopeRange(name=cmd.name, start=start, end=start + cmd.count - 1)



class ConfigSet(api.KeyValue, Command[KeyValue]):
    op = "config_set"


@command(ConfigSet)
def config_set(s: ClusterState, batch: Batch, now: float, cmd: ConfigSet) -> KeyValue:
    s.put_config(batch, cmd.key, cmd.value)
    return KeyValue(key=cmd.key, value=cmd.value)


class ConfigDelete(api.KeyRef, Command[KeyRef]):
    op = "config_delete"


@command(ConfigDelete)
def config_delete(s: ClusterState, batch: Batch, now: float, cmd: ConfigDelete) -> KeyRef:
    s.put_config(batch, cmd.key, None)
    return KeyRef(key=cmd.key)


class KvSet(api.KeyValue, Command[KeyValue]):
    op = "kv_set"


def _lease_write(s: ClusterState, key: str, value: str | None) -> None:
    """The scheduler's lease record moves its epoch on by one at most (a takeover) and is never deleted: clustermgr
    tickets the epoch it holds for the blobnodes (libs/rpc/tickets.py), and each disk keeps the highest it saw, so
    an epoch leapt ahead by a holder of the scheduler's key would fence every later scheduler out there."""
    if key != LEADER_KEY:
        return
    if value is None:
        raise BadRequest(f"the scheduler lease record {LEADER_KEY!r} is never deleted")
    try:
        epoch = LeaderRecord.model_validate_json(value).epoch
    except ValueError:
        raise BadRequest(f"{LEADER_KEY!r} takes a scheduler lease record (host, term, epoch)") from None
    current = s.kv_get(key)
    held = LeaderRecord.model_validate_json(current).epoch if current else 0
    if not held <= epoch <= held + 1:
        raise Conflict(f"the scheduler lease is at epoch {held}: a write may keep it or take the next, not {epoch}")


@command(KvSet)
def kv_set(s: ClusterState, batch: Batch, now: float, cmd: KvSet) -> KeyValue:
    _lease_write(s, cmd.key, cmd.value)
    s.put_kv(batch, cmd.key, cmd.value)
    return KeyValue(key=cmd.key, value=cmd.value)


class KvDelete(api.KeyRef, Command[KeyRef]):
    op = "kv_delete"


@command(KvDelete)
def kv_delete(s: ClusterState, batch: Batch, now: float, cmd: KvDelete) -> KeyRef:
    _lease_write(s, cmd.key, None)
    s.put_kv(batch, cmd.key, None)
    return KeyRef(key=cmd.key)


class KvCas(api.KeyCas, Command[MaybeValue]):
    op = "kv_cas"


@command(KvCas)
def kv_cas(s: ClusterState, batch: Batch, now: float, cmd: KvCas) -> MaybeValue:
    """Set (or delete, value None) `key` only if it currently equals `expected` (None: absent)."""
    current = s.kv_get(cmd.key)
    if current != cmd.expected:
        raise Conflict(f"kv {cmd.key!r} is {current!r}, expected {cmd.expected!r}")
    _lease_write(s, cmd.key, cmd.value)
    s.put_kv(batch, cmd.key, cmd.value)
    return MaybeValue(key=cmd.key, value=cmd.value)


class UndeleteAdd(api.Undelete, Command[UndeleteTaken]):
    op = "undelete_add"


@command(UndeleteAdd)
def undelete_add(s: ClusterState, batch: Batch, now: float, cmd: UndeleteAdd) -> UndeleteTaken:
    """Record each slice as undeleted now, and forget the records past their time: they are collected as later
    undeletes come, so no more are ever kept than the undeletes of one `keep` span made."""
    kept = s.undelete_records()
    for key, record in kept.items():
        if record.until < now:
            s.put_kv(batch, key, None)
    for piece in cmd.slices:
        key = undelete_key(piece.vid, piece.min_bid)
        old = kept.get(key)
        record = UndeleteRecord(count=max(piece.count, old.count if old else 0), at=now,
                                until=max(now + cmd.keep, old.until if old else 0.0))
        s.put_kv(batch, key, record.model_dump_json())
    return UndeleteTaken(at=now)
