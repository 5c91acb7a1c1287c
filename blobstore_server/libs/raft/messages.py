"""Raft records: log entries, membership, snapshot metadata and peer messages.

Plain slotted dataclasses so that the core, the fake network of the tests and the wire codec
share one vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum


class EntryKind(IntEnum):
    NORMAL = 0
    NOOP = 1  # appended by every new leader so that it can commit entries of its own term
    CONFIG = 2  # data is the full member set (see `encode_members`)


@dataclass(slots=True, frozen=True)
class Entry:
    index: int
    term: int
    kind: EntryKind = EntryKind.NORMAL
    data: bytes = b""


@dataclass(slots=True, frozen=True)
class Member:
    addr: str
    voter: bool = True


Members = dict[int, Member]


def encode_members(members: Members) -> bytes:
    return json.dumps({str(k): [m.addr, m.voter] for k, m in sorted(members.items())}).encode()


def decode_members(raw: bytes) -> Members:
    return {int(k): Member(addr, bool(voter)) for k, (addr, voter) in json.loads(raw).items()}


@dataclass(slots=True, frozen=True)
class SnapshotMeta:
    index: int
    term: int
    members: Members = field(default_factory=dict)


@dataclass(slots=True)
class Message:
    """Common header of every peer message."""

    term: int
    frm: int
    to: int


@dataclass(slots=True)
class PreVote(Message):
    """Would you vote for me at `term`? Changes nobody's term (pre-vote, Raft thesis 9.6)."""

    last_index: int = 0
    last_term: int = 0


@dataclass(slots=True)
class PreVoteResp(Message):
    granted: bool = False


@dataclass(slots=True)
class Vote(Message):
    last_index: int = 0
    last_term: int = 0


@dataclass(slots=True)
class VoteResp(Message):
    granted: bool = False


@dataclass(slots=True)
class Append(Message):
    """AppendEntries; also the heartbeat. `seq` confirms ReadIndex rounds; `ck_*` carries the
    leader's state checksum at an applied index for followers to compare."""

    prev_index: int = 0
    prev_term: int = 0
    commit: int = 0
    seq: int = 0
    ck_index: int = 0
    ck_value: int = 0
    entries: list[Entry] = field(default_factory=list)


@dataclass(slots=True)
class AppendResp(Message):
    """`index`: on success the last index known to match (and fsync'd); on reject the
    rejected prev_index. `hint`: on reject, the follower's guess of a matching index."""

    success: bool = False
    index: int = 0
    hint: int = 0
    seq: int = 0


@dataclass(slots=True)
class SnapChunk(Message):
    """A piece of the snapshot file `index`/`snap_term` at byte `offset` of `total`."""

    index: int = 0
    snap_term: int = 0
    offset: int = 0
    total: int = 0
    data: bytes = b""


@dataclass(slots=True)
class SnapAck(Message):
    """The receiver holds `next_offset` bytes of snapshot `index`; `done` once installed."""

    index: int = 0
    next_offset: int = 0
    done: bool = False
