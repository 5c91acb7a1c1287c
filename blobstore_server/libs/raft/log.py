"""Durable Raft log and hard state in a RocksDB store (libs/kv).

One synced write batch carries every output gathered while the previous write was in flight:
that is the group commit (one fsync for many proposals, on every node).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.raft.errors import InvariantViolation
from blobstore_server.libs.raft.messages import Entry, EntryKind
from blobstore_server.libs.raft.output import Output

LOG, META = "log", "meta"
_KEY = struct.Struct("!Q")
_ENTRY_HEAD = struct.Struct("!QB")
_HARD = struct.Struct("!Qq")
_MARK = struct.Struct("!QQ")


def _key(index: int) -> bytes:
    return _KEY.pack(index)


@dataclass
class Stored:
    """What a restarting node finds on disk."""

    term: int = 0
    vote: int | None = None
    commit: int = 0
    offset: tuple[int, int] = (0, 0)
    entries: list[Entry] = field(default_factory=list)


class RaftLog:
    def __init__(self, path: Path, fsync: bool = True) -> None:
        self.kv = KVStore(path, [LOG, META], sync=fsync)
        self.first = 1
        self.last = 0
        self.term, self.vote = 0, -1

    def load(self) -> Stored:
        st = Stored()
        raw = self.kv.get(META, b"hard")
        if raw:
            st.term, vote = _HARD.unpack(raw)
            st.vote = None if vote < 0 else vote
        self.term, self.vote = st.term, st.vote if st.vote is not None else -1
        raw = self.kv.get(META, b"commit")
        st.commit = _KEY.unpack(raw)[0] if raw else 0
        raw = self.kv.get(META, b"offset")
        st.offset = _MARK.unpack(raw) if raw else (0, 0)
        expect = st.offset[0] + 1
        for key, value in self.kv.items(LOG, _key(expect)):
            index = _KEY.unpack(key)[0]
            if index != expect:
                raise InvariantViolation(f"log has a hole: found {index}, expected {expect}")
            term, kind = _ENTRY_HEAD.unpack_from(value)
            st.entries.append(Entry(index, term, EntryKind(kind), value[_ENTRY_HEAD.size:]))
            expect += 1
        self.first, self.last = st.offset[0] + 1, st.offset[0] + len(st.entries)
        return st

    def write(self, outputs: list[Output]) -> int:
        """Persist the durable part of `outputs`, in order, in one synced batch; how many synced writes: 1, or 0
        when nothing in them is durable."""
        batch = self.kv.batch()
        for out in outputs:
            if out.hard_state:
                hs = out.hard_state
                vote = -1 if hs.vote is None else hs.vote
                if hs.term == self.term and self.vote >= 0 and vote != self.vote:
                    raise InvariantViolation(f"vote for {vote} in term {hs.term} after voting {self.vote}")
                if hs.term < self.term:
                    raise InvariantViolation(f"term going back from {self.term} to {hs.term}")
                self.term, self.vote = hs.term, vote
                batch.put(META, b"hard", _HARD.pack(hs.term, vote))
            if out.log_reset is not None:
                self._delete(batch, self.first, self.last)
                self.first = out.log_reset[0] + 1
                self.last = out.log_reset[0]
                batch.put(META, b"offset", _MARK.pack(*out.log_reset))
            if out.truncate_from is not None:
                self._delete(batch, out.truncate_from, self.last)
                self.last = min(self.last, out.truncate_from - 1)
            for e in out.entries:
                batch.put(LOG, _key(e.index), _ENTRY_HEAD.pack(e.term, e.kind) + e.data)
                self.last = e.index
            if out.compact_to is not None and out.compact_to[0] >= self.first:
                self._delete(batch, self.first, out.compact_to[0])
                self.first = out.compact_to[0] + 1
                batch.put(META, b"offset", _MARK.pack(*out.compact_to))
        if batch.count:  # the commit index rides along; alone (a heartbeat's) it would cost a sync for nothing
            commit = max(out.commit for out in outputs)
            if commit:
                batch.put(META, b"commit", _KEY.pack(commit))
            self.kv.write(batch)
            return 1
        return 0

    @staticmethod
    def _delete(batch: Batch, lo: int, hi: int) -> None:
        for index in range(lo, hi + 1):
            batch.delete(LOG, _key(index))

    def close(self) -> None:
        self.kv.close()
