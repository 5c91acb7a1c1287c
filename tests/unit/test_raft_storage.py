"""Wire codec and durable log of libs.raft."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobstore_server.libs import raft
from blobstore_server.libs.raft.codec import decode, encode
from blobstore_server.libs.raft.errors import InvariantViolation
from blobstore_server.libs.raft.log import RaftLog
from blobstore_server.libs.raft.messages import (
    Append,
    AppendResp,
    Entry,
    EntryKind,
    PreVote,
    PreVoteResp,
    SnapAck,
    SnapChunk,
    Vote,
    VoteResp,
)
from blobstore_server.libs.raft.output import HardState, Output

U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
ENTRIES = st.lists(st.builds(Entry, U64, U64, st.sampled_from(list(EntryKind)), st.binary(max_size=64)),
                   max_size=5)
MESSAGES = st.one_of(
    st.builds(PreVote, U64, U32, U32, U64, U64),
    st.builds(PreVoteResp, U64, U32, U32, st.booleans()),
    st.builds(Vote, U64, U32, U32, U64, U64),
    st.builds(VoteResp, U64, U32, U32, st.booleans()),
    st.builds(Append, U64, U32, U32, U64, U64, U64, U64, U64, U64, ENTRIES),
    st.builds(AppendResp, U64, U32, U32, st.booleans(), U64, U64, U64),
    st.builds(SnapChunk, U64, U32, U32, U64, U64, U64, U64, st.binary(max_size=100)),
    st.builds(SnapAck, U64, U32, U32, U64, U64, st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_codec_round_trips_every_message(msg: object) -> None:
    assert decode(encode(msg)) == msg  # type: ignore[arg-type]


def _e(index: int, term: int) -> Entry:
    return Entry(index, term, EntryKind.NORMAL, b"%d" % index)


def test_log_survives_reopen_with_truncation_and_compaction(tmp_path: Path) -> None:
    log = RaftLog(tmp_path / "raft")
    log.load()
    log.write([Output(hard_state=HardState(1, 1), entries=[_e(i, 1) for i in range(1, 11)], commit=3)])
    log.write([Output(truncate_from=8, entries=[_e(8, 2), _e(9, 2)]), Output(compact_to=(4, 1))])
    log.close()
    log = RaftLog(tmp_path / "raft")
    st = log.load()
    assert (st.term, st.vote, st.commit, st.offset) == (1, 1, 3, (4, 1))
    assert [(e.index, e.term) for e in st.entries] == [(5, 1), (6, 1), (7, 1), (8, 2), (9, 2)]
    log.write([Output(log_reset=(20, 3))])
    log.close()
    log = RaftLog(tmp_path / "raft")
    st = log.load()
    assert st.offset == (20, 3) and st.entries == []
    log.close()


def test_the_commit_index_alone_costs_no_synced_write_and_rides_along_with_the_next(tmp_path: Path) -> None:
    log = RaftLog(tmp_path / "raft")
    log.load()
    assert log.write([Output(hard_state=HardState(1, 1), entries=[_e(1, 1), _e(2, 1)], commit=1)]) == 1
    assert log.write([Output(commit=2), Output(commit=2)]) == 0  # heartbeats: a commit index, nothing durable
    log.close()
    log = RaftLog(tmp_path / "raft")
    assert log.load().commit == 1  # a lower bound, as Raft's volatile commit index may be after a restart
    assert log.write([Output(commit=2), Output(entries=[_e(3, 1)], commit=3), Output(commit=3)]) == 1
    log.close()
    log = RaftLog(tmp_path / "raft")
    assert log.load().commit == 3
    log.close()


def test_log_refuses_a_second_vote_in_a_term(tmp_path: Path) -> None:
    log = RaftLog(tmp_path / "raft")
    log.load()
    log.write([Output(hard_state=HardState(4, 2))])
    log.write([Output(hard_state=HardState(4, 2))])
    with pytest.raises(InvariantViolation):
        log.write([Output(hard_state=HardState(4, 3))])
    with pytest.raises(InvariantViolation):
        log.write([Output(hard_state=HardState(3, None))])
    log.write([Output(hard_state=HardState(5, 3))])
    log.close()


def test_public_surface_is_explicit() -> None:

    assert sorted(raft.__all__) == raft.__all__
    for name in raft.__all__:
        assert getattr(raft, name) is not None
