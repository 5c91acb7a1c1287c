"""Client sessions in the state machine: each mutating command applies once (Raft thesis 6.3).

A command proposed with a `Session` (client id, seq, acked) is applied the first time that (client,
seq) reaches the state machine; its answer is kept, and a retry of it (a second log entry, proposed
after the first reply was lost) gets that answer back and changes nothing. A client may have many
commands in flight, so the answers of every seq above its `acked` are kept; those up to `acked` are
forgotten, and a command that old is refused rather than applied a second time.

The table lives in the state's RocksDB (column family `session`), so it is in snapshots and in the
state checksum. It is bounded: a session idle for `ttl` seconds is dropped, and beyond `limit`
sessions the longest idle ones go first, both judged by the leader's clock carried in the command,
so every replica drops the same ones. A retry is recognised as long as its session is kept: clients
retry for seconds, sessions live for minutes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pydantic import Field

from libs.kv import Batch, KVStore
from libs.proto.clustermgr import Session
from libs.rpc.errors import Conflict

CF = "session"
MAX_KEPT = 1024  # answers kept per session beyond its acked seq (commands one client has in flight)
MAX_DROPS = 16  # sessions dropped per command at most, so that an apply stays short
_COUNT = b"#"


class LoggedSession(Session):
    """A session as logged: the client's, with the table's bounds the leader applies."""

    ttl: float = Field(gt=0)
    limit: int = Field(ge=1)


@dataclass
class _Meta:
    active: int  # microseconds of the leader's clock at its last command
    floor: int  # every seq up to it is acknowledged or forgotten
    kept: int  # answers stored


def _meta_key(client: str) -> bytes:
    return b"s" + client.encode()


def _answers(client: str) -> bytes:
    return b"r" + client.encode() + b"/"


def _answer_key(client: str, seq: int) -> bytes:
    return _answers(client) + b"%016x" % seq


def _idle_key(active: int, client: str) -> bytes:
    return b"t%020d/" % active + client.encode()


def _micros(now: float) -> int:
    return max(0, round(now * 1_000_000))


def _load(kv: KVStore, client: str) -> _Meta | None:
    raw = kv.get(CF, _meta_key(client))
    return None if raw is None else _Meta(**json.loads(raw))


def count(kv: KVStore) -> int:
    raw = kv.get(CF, _COUNT)
    return int(raw) if raw else 0


def recall(kv: KVStore, session: Session) -> bytes | None:
    """The first answer of a retried command, or None for a command not applied yet. Raises Conflict
    for one at or below what its client acknowledged (a stale duplicate: applying it would repeat it)."""
    meta = _load(kv, session.client)
    if meta is None:
        return None
    answer = kv.get(CF, _answer_key(session.client, session.seq))
    if answer is None and session.seq <= meta.floor:
        raise Conflict(f"command {session.seq} of client {session.client} is older than the ones it acknowledged"
                       f" ({meta.floor}): answered, given up or forgotten, so not applied again")
    return answer


def record(kv: KVStore, batch: Batch, session: LoggedSession, now: float, answer: bytes | None) -> None:
    """The session's bookkeeping, in the command's batch: keep `answer` (None: nothing new to keep),
    forget what the client acknowledged, mark it active at `now`, and drop sessions idle for longer
    than the ttl or, over the limit, the longest idle."""
    client, active = session.client, _micros(now)
    sessions = count(kv)
    meta = _load(kv, client)
    if meta is None:
        meta = _Meta(active=active, floor=0, kept=0)
        sessions += 1
    else:
        batch.delete(CF, _idle_key(meta.active, client))
    if answer is not None:
        batch.put(CF, _answer_key(client, session.seq), answer)
        meta.kept += 1
    meta.floor = max(meta.floor, session.acked)
    for key, _ in kv.prefix_items(CF, _answers(client)):
        seq = int(key[-16:], 16)
        if seq > meta.floor and meta.kept <= MAX_KEPT:
            break
        batch.delete(CF, key)  # acknowledged, or the oldest of too many
        meta.kept -= 1
        meta.floor = max(meta.floor, seq)
    meta.active = active
    batch.put(CF, _meta_key(client), json.dumps(asdict(meta)).encode())
    batch.put(CF, _idle_key(active, client), b"")
    sessions -= _drop_idle(kv, batch, client, active - _micros(session.ttl), sessions - session.limit)
    batch.put(CF, _COUNT, str(sessions).encode())


def _drop_idle(kv: KVStore, batch: Batch, current: str, horizon: int, excess: int) -> int:
    """Drop sessions idle since before `horizon`, and `excess` more, longest idle first; how many."""
    dropped = 0
    for key, _ in kv.items(CF, b"t", b"u"):
        stamp, _, raw_client = key[1:].partition(b"/")
        client = raw_client.decode()
        if client == current:
            continue
        if dropped >= MAX_DROPS or (int(stamp) >= horizon and dropped >= excess):
            break
        batch.delete(CF, key)
        batch.delete(CF, _meta_key(client))
        for answer, _ in kv.prefix_items(CF, _answers(client)):
            batch.delete(CF, answer)
        dropped += 1
    return dropped
