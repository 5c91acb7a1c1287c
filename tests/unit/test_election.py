"""The scheduler election's rules (services/scheduler/election.py): an epoch belongs to the process that won it.
A restart under the same name takes the next epoch at once (its predecessor, should it still run, is fenced);
a process superseded by a namesake waits like any standby; no epoch is ever won twice."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from blobstore_server.libs.proto.scheduler import LeaderRecord
from blobstore_server.services.scheduler.election import Claim, Election

TTL = 6.0


def test_a_restart_under_the_same_name_takes_the_next_epoch_at_once() -> None:
    old = Election("s1", TTL)
    first = old.decide(None, 0.0)
    assert first is not None
    old.won(first, 0.0)
    renewal = old.decide(first.record, 2.0)
    assert renewal == Claim(first.record, LeaderRecord(host="s1", term=2, epoch=1))  # only the winner renews
    old.won(renewal, 2.0)
    restarted = Election("s1", TTL)  # same name, new process: the record names it, yet it never won epoch 1
    claim = restarted.decide(renewal.record, 2.5)
    assert claim == Claim(renewal.record, LeaderRecord(host="s1", term=3, epoch=2))
    restarted.won(claim, 2.5)
    # The old process wakes: its name is in the record, but not its epoch. It renews nothing, waits a whole ttl
    # of silence like any standby, and its own deadline (2 + ttl) has passed anyway.
    assert old.decide(claim.record, 9.0) is None and not old.active(9.0)
    assert old.decide(claim.record, 14.9) is None
    taken = old.decide(claim.record, 15.0)  # the namesake went silent for a ttl: a takeover, with a new epoch
    assert taken == Claim(claim.record, LeaderRecord(host="s1", term=4, epoch=3))


def test_a_renewing_holder_keeps_its_epoch_and_a_namesake_never_reuses_it() -> None:
    holder = Election("s1", TTL)
    record = None
    for step in range(5):
        claim = holder.decide(record, step * 2.0)
        assert claim is not None and claim.record.epoch == 1 and claim.record.term == step + 1
        holder.won(claim, step * 2.0)
        record = claim.record
    assert holder.active(record.term * 2.0) and holder.leader == "s1"
    namesakes = [Election("s1", TTL) for _ in range(3)]
    epochs = []
    for namesake in namesakes:  # each restart in turn: each one bumps, none renews another's epoch
        claim = namesake.decide(record, 20.0)
        assert claim is not None and claim.expected == record
        namesake.won(claim, 20.0)
        record = claim.record
        epochs.append(record.epoch)
    assert epochs == [2, 3, 4]
    for superseded in (holder, *namesakes[:-1]):
        assert superseded.decide(record, 20.1) is None and not superseded.active(20.1)


def test_a_claim_whose_outcome_was_unknown_is_never_renewed_by_guess() -> None:
    """A takeover whose CAS answer was lost: the record shows the claim, but the process never learnt it won. A
    fresh process takes the next epoch at once (an epoch too many, never one twice); one that won before waits."""
    fresh = Election("s2", TTL)
    lost_answer = fresh.decide(LeaderRecord(host="s2", term=7, epoch=4), 0.0)
    assert lost_answer is not None and lost_answer.record.epoch == 5
    again = fresh.decide(lost_answer.record, 2.0)
    assert again is not None and again.record.epoch == 6
    veteran = Election("s3", TTL)
    won = veteran.decide(None, 0.0)
    assert won is not None
    veteran.won(won, 0.0)
    veteran.lost()  # superseded by "b", then its own takeover's answer lost
    after = LeaderRecord(host="s3", term=3, epoch=3)
    assert veteran.decide(after, 10.0) is None and veteran.decide(after, 15.9) is None
    retake = veteran.decide(after, 16.0)
    assert retake is not None and retake.record.epoch == 4


def test_someone_elses_record_is_taken_over_only_after_a_whole_ttl_unchanged() -> None:
    standby = Election("b", TTL)
    record = LeaderRecord(host="a", term=1, epoch=1)
    assert standby.decide(record, 0.0) is None
    assert standby.decide(record, 5.9) is None
    renewed = LeaderRecord(host="a", term=2, epoch=1)
    assert standby.decide(renewed, 6.0) is None  # changed: the clock starts again
    assert standby.decide(renewed, 11.9) is None and standby.leader == "a"
    claim = standby.decide(renewed, 12.0)
    assert claim == Claim(renewed, LeaderRecord(host="b", term=3, epoch=2))


@dataclass
class Process:
    election: Election
    number: int  # which process: names repeat, processes do not
    paused_until: float = 0.0
    won: list[int] = field(default_factory=list)


def test_no_epoch_is_ever_won_twice_and_only_its_winner_renews_it() -> None:
    """Random runs of processes under two names campaigning on one CAS register: they pause, restart (a new
    process under the same name), and lose CAS answers (the write done, or not). Whatever happens: the epoch
    never goes back, each epoch is won by one process, every renewal is its winner's, and no two processes ever
    count themselves active under one epoch."""
    for seed in range(200):
        rng = random.Random(seed)
        count = 0

        def spawn(name: str) -> Process:
            nonlocal count
            count += 1
            return Process(Election(name, TTL), count)

        processes = [spawn("a"), spawn("a"), spawn("b")]
        record: LeaderRecord | None = None
        owner: dict[int, int] = {}  # epoch -> the process that wrote it first
        now = 0.0
        for _ in range(400):
            now += rng.uniform(0.0, TTL / 2)
            process = rng.choice(processes)
            if rng.random() < 0.05:  # a restart: a new process under the same name
                processes[processes.index(process)] = process = spawn(process.election.me)
            if rng.random() < 0.1:
                process.paused_until = now + rng.uniform(0.0, 3 * TTL)
            if now < process.paused_until:
                continue
            claim = process.election.decide(record, now)
            if claim is None:
                continue
            committed = claim.expected == record and rng.random() < 0.9
            if committed:
                before = record
                record = claim.record
                assert record.host == process.election.me
                assert before is None or record.epoch >= before.epoch
                if before is not None and record.epoch == before.epoch:
                    assert owner[record.epoch] == process.number, "a renewal by a process that did not win the epoch"
                assert owner.setdefault(record.epoch, process.number) == process.number, f"epoch {record.epoch} twice"
            answer = rng.random()
            if committed and answer < 0.9:
                process.election.won(claim, now)
                process.won.append(claim.record.epoch)
            elif not committed and answer < 0.9:
                process.election.lost()  # a CAS conflict; otherwise the answer was lost either way
            active = [p.election.epoch for p in processes if p.election.active(now)]
            assert len(active) == len(set(active)), f"seed {seed}: two active processes under one epoch"
        assert all(owner[e] == p.number for p in processes for e in p.won)
