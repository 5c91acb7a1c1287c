"""Targeted behaviour of the Raft core over the fake network: pre-vote, ReadIndex, membership,
snapshot install, and the run-time invariants firing when broken."""

from __future__ import annotations

import pytest

from blobstore_server.libs.raft.core import RaftNode
from blobstore_server.libs.raft.errors import ConfigChangeInProgress, InvariantViolation, NotLeader
from blobstore_server.libs.raft.messages import Append, Entry, Member, SnapshotMeta, Vote
from blobstore_server.libs.raft.output import Role
from tests.support.raftkv.fakenet import FakeNetwork


def _elect(net: FakeNetwork) -> int:
    for _ in range(500):
        net.step()
        lead = net.leader()
        if lead and lead.core.commit >= lead.core.term_start:
            return lead.id
    raise AssertionError("no leader")


def test_partitioned_node_rejoining_does_not_disrupt_the_leader() -> None:
    net = FakeNetwork(3, seed=7)
    lead = _elect(net)
    term = net.nodes[lead].core.term
    loner = next(i for i in net.nodes if i != lead)
    net.partition({loner}, set(net.nodes) - {loner})
    net.run(300)  # many election timeouts: pre-votes fail, so its term never moves
    assert net.nodes[loner].core.term == term
    assert net.nodes[loner].core.role == Role.PRE_CANDIDATE
    net.heal()
    net.run(100)
    assert net.leader() is net.nodes[lead]
    assert net.nodes[lead].core.term == term
    assert net.nodes[loner].core.leader == lead


def test_leader_without_quorum_steps_down_and_a_new_one_is_elected() -> None:
    net = FakeNetwork(5, seed=3)
    old = _elect(net)
    net.partition({old}, set(net.nodes) - {old})
    net.run(200)
    assert net.nodes[old].core.role != Role.LEADER  # check-quorum
    new = net.leader()
    assert new is not None and new.id != old


def test_cut_off_leader_steps_down_within_two_election_timeouts() -> None:
    net = FakeNetwork(3, seed=12)
    lead = net.nodes[_elect(net)]
    net.partition({lead.id}, set(net.nodes) - {lead.id})
    limit = 2 * lead.core.election_ticks[0]
    net.run(limit)
    assert lead.core.role != Role.LEADER  # check-quorum: it no longer takes writes
    with pytest.raises(NotLeader):
        lead.core.propose([b"late"])


def test_a_paused_leader_is_replaced_and_steps_down_when_it_resumes() -> None:
    net = FakeNetwork(3, seed=13)
    old = net.nodes[_elect(net)]
    net.partition({old.id}, set(net.nodes) - {old.id})
    old.core.propose([b"stranded"])  # accepted just before it stopped: never reaches a follower
    old.core.read_index(5)
    net._drain(old)
    net.pause(old.id)
    net.heal()
    net.run(60)
    new = net.leader()
    assert new is not None and new.id != old.id and old.core.role == Role.LEADER  # stopped: it cannot know
    assert net.propose(b"meanwhile")
    net.run(5)
    net.resume(old.id)
    net.run(3)  # the first message of the new term deposes it
    assert old.core.role == Role.FOLLOWER and old.core.leader == new.id
    assert old.core.pending_reads == []  # its read fails rather than answer stale data
    net.settle()
    assert [e.data for e in old.state if e.data] == [e.data for e in new.state if e.data]
    assert b"stranded" not in {e.data for e in old.state} and b"meanwhile" in {e.data for e in old.state}


def test_read_index_needs_a_quorum_round() -> None:
    net = FakeNetwork(3, seed=5, max_delay=3)
    lead = net.nodes[_elect(net)]
    lead.core.read_index(41)
    net._drain(lead)
    assert lead.reads == []  # not before followers confirm the leadership
    net.run(8)
    assert lead.reads == [(41, lead.core.commit)]


def test_isolated_leader_cannot_confirm_reads() -> None:
    net = FakeNetwork(3, seed=11)
    lead = net.nodes[_elect(net)]
    net.partition({lead.id}, set(net.nodes) - {lead.id})
    lead.core.read_index(7)
    net.run(5)
    assert lead.core.pending_reads == [(lead.core.read_seq, 7)]
    net.run(100)  # it steps down: the read fails instead of answering stale data
    assert lead.core.role != Role.LEADER and lead.core.pending_reads == []
    with pytest.raises(NotLeader):
        lead.core.read_index(8)


def test_learner_is_replicated_but_never_votes_or_campaigns() -> None:
    net = FakeNetwork(3, seed=2, learners=1)
    lead = net.nodes[_elect(net)]
    assert net.change({**lead.core.members, 4: Member("n4", voter=False)})
    for i in range(20):
        net.propose(b"x%d" % i)
    net.settle()
    learner = net.nodes[4]
    assert learner.core.applied == lead.core.applied and 4 not in lead.core.voters()
    for i in net.initial.members:  # without the voters the learner waits, it never campaigns
        net.crash(i)
    net.run(300)
    assert learner.core.role == Role.FOLLOWER and learner.core.term == lead.core.term


def test_membership_changes_one_at_a_time() -> None:
    net = FakeNetwork(3, seed=4, learners=2)
    lead = net.nodes[_elect(net)]
    members = lead.core.members
    with pytest.raises(ValueError):
        lead.core.propose_config({**members, 4: Member("n4", False), 5: Member("n5", False)})
    lead.core.propose_config({**members, 4: Member("n4", False)})
    with pytest.raises(ConfigChangeInProgress):
        lead.core.propose_config({**members, 5: Member("n5", False)})


def test_removed_leader_steps_down_once_the_change_commits() -> None:
    net = FakeNetwork(3, seed=9)
    lead = net.nodes[_elect(net)]
    assert net.change({k: v for k, v in lead.core.members.items() if k != lead.id})
    net.run(200)
    new = net.leader()
    assert new is not None and new.id != lead.id and set(new.core.voters()) == set(net.nodes) - {lead.id}
    assert net.propose(b"after")
    net.settle()


def test_lagging_node_is_caught_up_by_snapshot_install() -> None:
    net = FakeNetwork(3, seed=6, snapshot_every=10, keep=2)
    lead = net.nodes[_elect(net)]
    lagger = next(i for i in net.nodes if i != lead.id)
    net.crash(lagger)
    for i in range(60):
        net.propose(b"s%d" % i)
        net.step()
    assert lead.core.offset_index > 0  # the log was compacted behind a snapshot
    net.restart(lagger, wipe=True)
    net.settle()
    node = net.nodes[lagger]
    assert node.core.snapshot.index > 0 and node.state == lead.state


def test_applied_index_must_advance_by_one() -> None:
    net = FakeNetwork(3, seed=1)
    lead = net.nodes[_elect(net)]
    with pytest.raises(InvariantViolation):
        lead.core.on_applied(lead.core.applied + 2)


def test_voting_twice_in_a_term_is_fatal() -> None:
    node = RaftNode(1, SnapshotMeta(0, 0, {i: Member(f"n{i}") for i in (1, 2, 3)}))
    node.step(Vote(5, 2, 1, 0, 0))
    assert node.vote == 2
    node.vote = None  # simulate a lost vote record, then a second candidate and a "recovered" vote
    node.step(Vote(5, 3, 1, 0, 0))
    node.vote = 2
    with pytest.raises(InvariantViolation):
        node._grant_vote(3)


def test_checksum_mismatch_with_the_leader_is_fatal() -> None:
    node = RaftNode(1, SnapshotMeta(0, 0, {i: Member(f"n{i}") for i in (1, 2, 3)}), checksum_interval=1)
    node.step(Append(1, 2, 1, 0, 0, 1, 0, 0, 0, [Entry(1, 1, data=b"a")]))
    node.persisted(1, 1)
    node.take_output()
    node.on_applied(1, checksum=1234)
    node.step(Append(1, 2, 1, 1, 1, 1, 0, 1, 1234, []))  # same checksum: fine
    with pytest.raises(InvariantViolation):
        node.step(Append(1, 2, 1, 1, 1, 1, 0, 1, 999, []))


def test_truncating_a_committed_entry_is_fatal() -> None:
    node = RaftNode(1, SnapshotMeta(0, 0, {i: Member(f"n{i}") for i in (1, 2, 3)}))
    node.step(Append(1, 2, 1, 0, 0, 0, 0, 0, 0, [Entry(1, 1), Entry(2, 1)]))
    node.commit = 2  # a corrupted commit index: the next conflicting append must not erase entry 2
    node.step(Append(2, 3, 1, 1, 1, 0, 0, 0, 0, [Entry(2, 2)]))
    assert node.term_at(2) == 1  # entries at or below commit are never compared nor replaced
    with pytest.raises(InvariantViolation):
        node._truncate(2)


def test_two_leaders_in_one_term_is_fatal() -> None:
    net = FakeNetwork(3, seed=8)
    lead = net.nodes[_elect(net)]
    other = next(i for i in net.nodes if i != lead.id)
    with pytest.raises(InvariantViolation):
        lead.core.step(Append(lead.core.term, other, lead.id, 0, 0, 0, 0, 0, 0, []))
