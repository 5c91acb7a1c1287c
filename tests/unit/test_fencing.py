"""Fencing tokens: the scheduler lease's epoch grows with every takeover, and clustermgr's state machine (not
anyone's clock) refuses a command sent under an epoch the lease record no longer carries; a chunk is
released only while it is no volume's live unit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.clustermgr import Fence, KeyValue, Session, lease_epoch
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import LEADER_KEY, LeaderRecord
from blobstore_server.libs.rpc.errors import BadRequest, Conflict, Fenced
from blobstore_server.services.clustermgr.commands.keys import KvCas, KvDelete, KvSet, ScopeAlloc
from blobstore_server.services.clustermgr.commands.units import UnitReleaseCmd
from blobstore_server.services.clustermgr.commands.volumes import VolumeCreate
from blobstore_server.services.clustermgr.machine import ClusterMachine
from blobstore_server.services.clustermgr.sessions import LoggedSession
from blobstore_server.services.scheduler.election import Election
from tests.support.clustermgr_state import Driver, add_disks, ec3p3_units


@pytest.fixture
def cm(tmp_path: Path) -> Iterator[Driver]:
    state = ClusterMachine(tmp_path / "state")
    yield Driver(state)
    state.close()


class Holder:
    """A lease holder's session: consecutive seqs, every command under `fence`."""

    def __init__(self, client: str, epoch: int) -> None:
        self.client, self.fence, self.seq = client, Fence(key=LEADER_KEY, epoch=epoch), 0

    def session(self) -> LoggedSession:
        self.seq += 1
        return LoggedSession(client=self.client, seq=self.seq, acked=self.seq - 1, fence=self.fence, ttl=600,
                             limit=100)


def lease(cm: Driver, expected: LeaderRecord | None, record: LeaderRecord) -> None:
    cm(KvCas(key=LEADER_KEY, expected=expected.model_dump_json() if expected else None,
             value=record.model_dump_json()))


def lease_at(cm: Driver, host: str, epoch: int) -> None:
    """The lease record taken over and over, up to `epoch` (each takeover takes the next epoch)."""
    held = None
    for step in range(1, epoch + 1):
        record = LeaderRecord(host=host, term=step, epoch=step)
        lease(cm, held, record)
        held = record


def test_the_lease_record_moves_on_one_epoch_at_most_and_stays(cm: Driver) -> None:
    """Every epoch of the record is one clustermgr tickets for blobnodes (libs/rpc/tickets.py): a holder of the
    scheduler's key may take the next, never leap ahead of every epoch a scheduler could win, nor delete it."""
    with pytest.raises(Conflict, match=r"at epoch 0: .* not 2"):
        lease(cm, None, LeaderRecord(host="s1", term=1, epoch=2))
    first = LeaderRecord(host="s1", term=1, epoch=1)
    lease(cm, None, first)
    for leap in (KvSet(key=LEADER_KEY, value=LeaderRecord(host="x", term=1, epoch=2**40).model_dump_json()),
                 KvCas(key=LEADER_KEY, expected=first.model_dump_json(),
                       value=LeaderRecord(host="x", term=2, epoch=3).model_dump_json())):
        with pytest.raises(Conflict, match="at epoch 1: a write may keep it or take the next"):
            cm(leap)
    with pytest.raises(BadRequest, match="never deleted"):
        cm(KvDelete(key=LEADER_KEY))
    with pytest.raises(BadRequest, match="takes a scheduler lease record"):
        cm(KvSet(key=LEADER_KEY, value="not a record"))
    cm(KvSet(key=LEADER_KEY, value=LeaderRecord(host="s2", term=2, epoch=2).model_dump_json()))  # a takeover
    assert lease_epoch(cm.state.kv_get(LEADER_KEY)) == 2


def test_a_superseded_holder_changes_nothing_however_late_its_commands_arrive(cm: Driver) -> None:
    first = LeaderRecord(host="s1", term=1, epoch=1)
    lease(cm, None, first)
    old = Holder("s1", 1)
    assert cm(KvSet(key="task/a", value="1"), old.session()) == KeyValue(key="task/a", value="1")
    renewed = LeaderRecord(host="s1", term=2, epoch=1)  # a renewal keeps the epoch
    lease(cm, first, renewed)
    cm(KvSet(key="task/a", value="2"), old.session())
    taken = LeaderRecord(host="s2", term=3, epoch=2)  # the standby's takeover
    lease(cm, renewed, taken)
    before = cm.state.checksum()
    for stale in (KvSet(key="task/a", value="3"), KvDelete(key="task/a"),
                  KvCas(key="task/a", expected="2", value="4"), ScopeAlloc(name="vid", count=1)):
        with pytest.raises(Fenced, match="epoch 1 of lease 'scheduler/leader', which is at epoch 2"):
            cm(stale, old.session())
    assert cm.state.kv_get("task/a") == "2" and cm.state.checksum() != before  # only the sessions' bookkeeping
    new = Holder("s2", 2)
    cm(KvSet(key="task/a", value="5"), new.session())
    assert cm.state.kv_get("task/a") == "5"
    assert lease_epoch(cm.state.kv_get(LEADER_KEY)) == 2


def test_a_fence_on_a_lease_never_taken_or_from_the_future_is_refused(cm: Driver) -> None:
    with pytest.raises(Fenced, match="at epoch 0"):
        cm(KvSet(key="k", value="v"), Holder("x", 1).session())
    lease_at(cm, "s1", 3)
    with pytest.raises(Fenced, match=r"epoch 4 .* at epoch 3"):
        cm(KvSet(key="k", value="v"), Holder("y", 4).session())
    cm(KvSet(key="k", value="v"))  # a command without a fence (an operator's) is judged as before


def test_a_chunk_is_released_only_while_it_is_no_live_unit(cm: Driver) -> None:
    add_disks(cm)
    cm(ScopeAlloc(name="vid", count=1))
    volume = cm(VolumeCreate(vid=1, code_mode=CodeMode.EC3P3, backend="isal", units=ec3p3_units(1),
                             capacity=1 << 30))
    live = volume.units[2].vuid
    with pytest.raises(Conflict, match="live: its chunk stays"):
        cm(UnitReleaseCmd(vid=1, vuid=live))
    cm(UnitReleaseCmd(vid=1, vuid=Vuid.make(1, 2, 7)))  # an epoch of unit 2 that is not live
    with pytest.raises(BadRequest, match="names no unit of volume 1"):
        cm(UnitReleaseCmd(vid=1, vuid=Vuid.make(2, 0, 1)))
    lease_at(cm, "s2", 2)
    with pytest.raises(Fenced):  # a superseded scheduler may not even ask
        cm(UnitReleaseCmd(vid=1, vuid=Vuid.make(1, 2, 7)), Holder("s1", 1).session())


def test_the_epoch_grows_with_each_takeover_and_only_then() -> None:
    me, other = Election("a", ttl=6.0), Election("b", ttl=6.0)
    claim = me.decide(None, 0.0)
    assert claim is not None and claim.record.epoch == 1
    me.won(claim, 0.0)
    renewal = me.decide(claim.record, 2.0)
    assert renewal is not None and (renewal.record.term, renewal.record.epoch) == (2, 1)
    assert other.decide(renewal.record, 3.0) is None  # seen: the clock starts
    takeover = other.decide(renewal.record, 9.0)
    assert takeover is not None and (takeover.record.host, takeover.record.epoch) == ("b", 2)
    back = me.decide(takeover.record, 10.0)
    assert back is None  # a's own clock is irrelevant: it sees b's record and waits


def test_the_fence_travels_in_the_session_header() -> None:
    session = Session(client="sched-1", seq=5, acked=4, fence=Fence(key=LEADER_KEY, epoch=9))
    assert session.header() == "sched-1 5 4 scheduler/leader 9"
    assert Session.parse(session.header()) == session
    assert Session.parse("c 2 1").fence is None
    with pytest.raises(ValueError, match="fence-key fence-epoch"):
        Session.parse("c 2 1 scheduler/leader")
