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

import math

from pydantic import Field

from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.clustermgr import Session
from blobstore_server.libs.rpc.errors import Conflict

CF = "session"
MAX_KEPT = 1024  # seqs above its acked whose answers a session keeps (commands one client has in flight)
MAX_DROPS = 64  # sessions dropped per sweep at most, so that an apply stays short
_TABLE = b"#"


class LoggedSession(Session):
    """A session as logged: the client's, with the table's bounds the leader applies."""

    ttl: float = Field(gt=0)
    limit: int = Field(ge=1)


# Keys, written so that a busy session costs two point reads and a few writes per command, and no
# scan over the tombstones its own deletes leave behind (a RocksDB iterator steps over every one).
#   s<client>              -> "active floor top": the second of its last command; every seq <= floor
#                             is settled; answers are kept for seqs in (floor, top]
#   r<client>/<seq, hex>   -> the answer of that command
#   t<second>/<client>     -> b"": the idle index, rewritten at most once a second per session
#   #                      -> "count swept": sessions, and the second of the last sweep for idle ones


def _meta_key(client: str) -> bytes:
    return b"s" + client.encode()


def _answers(client: str) -> bytes:
    return b"r" + client.encode() + b"/"


def _answer_key(client: str, seq: int) -> bytes:
    return _answers(client) + b"%016x" % seq


def _idle_key(second: int, client: str) -> bytes:
    return b"t%012d/" % second + client.encode()


def _second(now: float) -> int:
    return max(0, math.floor(now))


def _ints(raw: bytes | None, n: int) -> list[int]:
    return [int(x) for x in raw.split()] if raw else [0] * n


def count(kv: KVStore) -> int:
    return _ints(kv.get(CF, _TABLE), 2)[0]


class Visit:
    """One command's look at its session: `recall` before applying, `record` after."""

    def __init__(self, kv: KVStore, session: LoggedSession) -> None:
        self.kv, self.session = kv, session
        raw = kv.get(CF, _meta_key(session.client))
        self.known = raw is not None
        self.active, self.floor, self.top = _ints(raw, 3)

    def recall(self) -> bytes | None:
        """The first answer of a retried command, or None for a command not applied yet. Raises Conflict
        for one at or below what its client acknowledged (a stale duplicate: applying it would repeat it)."""
        client, seq = self.session.client, self.session.seq
        answer = self.kv.get(CF, _answer_key(client, seq)) if self.known and seq <= self.top else None
        if answer is None and seq <= self.floor:
            raise Conflict(f"command {seq} of client {client} is older than the ones it acknowledged ({self.floor}):"
                           " answered, given up or forgotten, so not applied again")
        return answer

    def record(self, batch: Batch, now: float, answer: bytes | None) -> None:
        """The session's bookkeeping, in the command's batch: keep `answer` (None: nothing new to keep),
        forget what the client acknowledged and, past MAX_KEPT, its oldest answers; then, on its first
        command in a second, move it in the idle index and sweep the table if nobody has this second."""
        session, second = self.session, _second(now)
        if answer is not None:
            batch.put(CF, _answer_key(session.client, session.seq), answer)
            self.top = max(self.top, session.seq)
        if session.acked > self.floor:
            self._forget(batch, session.acked)
        if self.top - self.floor > MAX_KEPT:
            self._forget(batch, self.top - MAX_KEPT)
        if not self.known or self.active != second:
            self._index(batch, second, now)
        batch.put(CF, _meta_key(session.client), b"%d %d %d" % (second, self.floor, self.top))

    def _forget(self, batch: Batch, floor: int) -> None:
        """Delete the answers of seqs up to `floor`: by key when they are a few (the usual step), else by
        a scan (a client that stopped acknowledging, or whose commands failed for a long while)."""
        client, low, high = self.session.client, self.floor, min(floor, self.top)
        if high - low <= 2 * MAX_KEPT:
            for seq in range(low + 1, high + 1):
                batch.delete(CF, _answer_key(client, seq))
        else:
            for key, _ in self.kv.prefix_items(CF, _answers(client)):
                if int(key[-16:], 16) <= floor:
                    batch.delete(CF, key)
        self.floor = floor

    def _index(self, batch: Batch, second: int, now: float) -> None:
        client, session = self.session.client, self.session
        sessions, swept = before = tuple(_ints(self.kv.get(CF, _TABLE), 2))
        if self.known:
            batch.delete(CF, _idle_key(self.active, client))
        else:
            sessions += 1
        batch.put(CF, _idle_key(second, client), b"")
        if sessions > session.limit or second > swept:
            sessions -= _drop_idle(self.kv, batch, client, _second(now - session.ttl), sessions - session.limit)
            swept = second
        if (sessions, swept) != before:
            batch.put(CF, _TABLE, b"%d %d" % (sessions, swept))


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
