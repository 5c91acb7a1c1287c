"""The Raft state machine, free of I/O: events in, `Output` instructions out.

Events: `tick`, `step(message)`, `propose`, `propose_config`, `read_index`, `persisted`,
`on_applied`, `install_snapshot`, `compact`, `snapshot_sent`. The shell drains `take_output()`
after each event. Time is counted in ticks; randomness comes from an injected `random.Random`
so that the simulated tests are reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from blobstore_server.libs.raft.errors import ConfigChangeInProgress, InvariantViolation, NotLeader
from blobstore_server.libs.raft.messages import (
    Append,
    AppendResp,
    Entry,
    EntryKind,
    Members,
    Message,
    PreVote,
    PreVoteResp,
    SnapshotMeta,
    Vote,
    VoteResp,
    decode_members,
    encode_members,
)
from blobstore_server.libs.raft.output import Flow, HardState, Output, Progress, Role


class RaftNode:
    def __init__(self, node_id: int, snapshot: SnapshotMeta, *, term: int = 0, vote: int | None = None,
                 commit: int = 0, offset: tuple[int, int] = (0, 0), entries: Iterable[Entry] = (),
                 election_ticks: tuple[int, int] = (10, 20), heartbeat_ticks: int = 2,
                 max_batch: int = 512, max_inflight: int = 8192, checksum_interval: int = 1000,
                 rng: random.Random | None = None) -> None:
        """Restart from durable state: the latest snapshot, hard state and the stored log
        (entries after `offset`, all of them durable)."""
        self.id = node_id
        self.term, self.vote = term, vote
        self.election_ticks, self.heartbeat_ticks = election_ticks, heartbeat_ticks
        self.max_batch, self.max_inflight = max_batch, max_inflight
        self.checksum_interval = checksum_interval
        self.rng = rng or random.Random()
        self._out = Output()
        self.role = Role.FOLLOWER
        self.leader: int | None = None
        self.offset_index, self.offset_term = offset
        self.log: list[Entry] = list(entries)
        self.commit = self.applied = self.applying = 0
        self.stable = self.last_index()
        self.snapshot = snapshot
        self.configs: list[tuple[int, Members]] = []
        self.members: Members = {}
        self._reset_to_snapshot(snapshot)
        self._out.members = dict(self.members)
        self.commit = max(self.commit, min(commit, self.last_index()))
        self.progress: dict[int, Progress] = {}
        self.votes: set[int] = set()
        self.elapsed = self.hb_elapsed = 0
        self.timeout = self._random_timeout()
        self.recent_active: set[int] = set()
        self.term_start = 0
        self.read_seq = 0
        self.pending_reads: list[tuple[int, int]] = []  # (seq, request id)
        self.checksums: dict[int, int] = {}  # own state checksums at recent applied indexes
        self.leader_ck = (0, 0)  # latest (index, checksum) announced by the leader
        self._hs = HardState(term, vote)
        self._ready_apply()

    # ----------------------------------------------------------------- log helpers
    def last_index(self) -> int:
        return self.offset_index + len(self.log)

    def last_term(self) -> int:
        return self.log[-1].term if self.log else self.offset_term

    def term_at(self, index: int) -> int | None:
        if index == self.offset_index:
            return self.offset_term
        if index < self.offset_index or index > self.last_index():
            return None
        return self.log[index - self.offset_index - 1].term

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Entries lo..hi inclusive (lo must be after the offset)."""
        return self.log[lo - self.offset_index - 1: hi - self.offset_index]

    def voters(self) -> list[int]:
        return [i for i, m in self.members.items() if m.voter]

    def quorum(self) -> int:
        return len(self.voters()) // 2 + 1

    def _random_timeout(self) -> int:
        return self.rng.randint(*self.election_ticks)

    # ------------------------------------------------------------------- output
    def take_output(self) -> Output:
        hs = HardState(self.term, self.vote)
        if hs != self._hs:
            self._out.hard_state, self._hs = hs, hs
        self._out.commit = self.commit
        out, self._out = self._out, Output()
        return out

    def _send(self, msg: Message, after_persist: bool = False) -> None:
        (self._out.send_after_persist if after_persist else self._out.send).append(msg)

    # ------------------------------------------------------------------- events
    def tick(self) -> None:
        self.elapsed += 1
        if self.role == Role.LEADER:
            self.hb_elapsed += 1
            if self.hb_elapsed >= self.heartbeat_ticks:
                self.hb_elapsed = 0
                self._heartbeat()
            if self.elapsed >= self.election_ticks[0]:
                self.elapsed = 0
                self._check_quorum()
        elif self.elapsed >= self.timeout and self.id in self.voters():
            self._pre_vote()

    def step(self, msg: Message) -> None:
        if isinstance(msg, PreVote):
            self._on_pre_vote(msg)
            return
        if msg.term > self.term:
            if isinstance(msg, Vote) and self._leader_is_fresh():
                return  # a live leader exists: do not let a stray candidate depose it
            if isinstance(msg, PreVoteResp) and msg.granted:
                pass  # granted pre-votes carry the future term, not a real one
            else:
                self._become_follower(msg.term, msg.frm if isinstance(msg, Append) else None)
        elif msg.term < self.term:
            if isinstance(msg, Append):  # tell the stale leader about the new term
                self._send(AppendResp(self.term, self.id, msg.frm, False, msg.prev_index, 0, 0))
            return
        if isinstance(msg, Append):
            self._on_append(msg)
        elif isinstance(msg, AppendResp):
            self._on_append_resp(msg)
        elif isinstance(msg, Vote):
            self._on_vote(msg)
        elif isinstance(msg, VoteResp):
            self._on_vote_resp(msg)
        elif isinstance(msg, PreVoteResp):
            self._on_pre_vote_resp(msg)

    def propose(self, commands: list[bytes]) -> list[tuple[int, int]]:
        """Append commands to the leader's log; returns their (index, term)."""
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        start = self.last_index() + 1
        self._append_local([Entry(start + i, self.term, EntryKind.NORMAL, c) for i, c in enumerate(commands)])
        return [(start + i, self.term) for i in range(len(commands))]

    def propose_config(self, members: Members) -> tuple[int, int]:
        """Propose a new member set differing from the current one by one node."""
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        if self.configs[-1][0] > self.commit:
            raise ConfigChangeInProgress("the previous membership change is not committed yet")
        changed = {i for i in set(members) | set(self.members) if members.get(i) != self.members.get(i)}
        if len(changed) > 1:
            raise ValueError(f"membership changes one node at a time, not {sorted(changed)}")
        index = self.last_index() + 1
        self._append_local([Entry(index, self.term, EntryKind.CONFIG, encode_members(members))])
        return index, self.term

    def read_index(self, request_id: int) -> None:
        """Start a ReadIndex round; the answer comes in `Output.reads`."""
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        self.read_seq += 1
        self.pending_reads.append((self.read_seq, request_id))
        self._heartbeat()
        self._release_reads()

    def persisted(self, index: int, term: int) -> None:
        """The shell made entries up to `index` (of `term`) durable."""
        if index > self.stable and self.term_at(index) == term:
            self.stable = index
            if self.role == Role.LEADER:
                self._maybe_commit()
            self._ready_apply()

    def on_applied(self, index: int, checksum: int | None = None) -> None:
        """The state machine applied `index`; `checksum` is its state checksum if index is a
        multiple of `checksum_interval`."""
        if index != self.applied + 1 or index > self.applying:
            raise InvariantViolation(f"node {self.id}: applied {index} after {self.applied}")
        self.applied = index
        if checksum is not None:
            self.checksums[index] = checksum
            for old in [i for i in self.checksums if i < index - 8 * self.checksum_interval]:
                del self.checksums[old]
        self._compare_checksum()

    def snapshot_meta(self, index: int) -> SnapshotMeta:
        """Metadata of a snapshot of the state machine at applied `index`."""
        term = self.term_at(index)
        if term is None or index > self.applied:
            raise ValueError(f"cannot snapshot at {index} (applied {self.applied})")
        members = next(m for i, m in reversed(self.configs) if i <= index)
        return SnapshotMeta(index, term, dict(members))

    def compact(self, meta: SnapshotMeta, keep: int = 0) -> None:
        """The shell stored snapshot `meta`; drop log entries behind it but the last `keep`."""
        if meta.index <= self.snapshot.index:
            return
        self.snapshot = meta
        cut = meta.index - keep
        if cut > self.offset_index:
            self.offset_term = self.term_at(cut) or self.offset_term
            self.log = self.log[cut - self.offset_index:]
            self.offset_index = cut
            self._out.compact_to = (cut, self.offset_term)
            while len(self.configs) > 1 and self.configs[1][0] <= cut:
                self.configs.pop(0)

    def install_snapshot(self, term: int, leader: int, meta: SnapshotMeta) -> bool:
        """A snapshot from `leader` arrived whole. True if the shell must restore it (the
        instructions are in the output), False if it is stale."""
        if term < self.term:
            return False
        if term > self.term or self.role != Role.FOLLOWER:
            self._become_follower(term, leader)
        self.leader, self.elapsed = leader, 0
        if meta.index <= self.commit:
            self._send(AppendResp(self.term, self.id, leader, True, self.commit, 0, 0))
            return False
        self._reset_to_snapshot(meta)
        self._out.apply = [e for e in self._out.apply if e.index > meta.index]
        self._out.restore = meta
        self._out.members = dict(self.members)
        self._send(AppendResp(self.term, self.id, leader, True, meta.index, 0, 0), after_persist=True)
        return True

    def snapshot_sent(self, peer: int, ok: bool) -> None:
        """The shell finished (or gave up) streaming a snapshot to `peer`."""
        pr = self.progress.get(peer)
        if self.role == Role.LEADER and pr is not None and pr.flow == Flow.SNAPSHOT:
            pr.flow, pr.probe_sent = Flow.PROBE, False
            if ok:
                pr.next = max(pr.next, self.snapshot.index + 1)
            self._send_append(peer)

    # ------------------------------------------------------------- state changes
    def _reset_to_snapshot(self, meta: SnapshotMeta) -> None:
        """Make `meta` the base of the log, keeping entries after it only if they match."""
        if meta.index > self.offset_index:
            if self.term_at(meta.index) == meta.term:
                self.log = self.log[meta.index - self.offset_index:]
            else:
                self.log = []
                self._out.log_reset = (meta.index, meta.term)
                self.stable = meta.index
            self.offset_index, self.offset_term = meta.index, meta.term
        self.snapshot = meta
        self.configs = [(meta.index, dict(meta.members))]
        self.members = dict(meta.members)
        self._on_appended(self.log, announce=False)
        self.commit = max(self.commit, meta.index)
        self.applied = self.applying = max(self.applied, meta.index)
        self.stable = max(self.stable, meta.index)

    def _become_follower(self, term: int, leader: int | None) -> None:
        if term != self.term:
            self.term, self.vote = term, None
        self.role, self.leader = Role.FOLLOWER, leader
        self.elapsed, self.timeout = 0, self._random_timeout()
        self.progress.clear()
        self._out.reads_failed.extend(rid for _, rid in self.pending_reads)
        self.pending_reads.clear()

    def _leader_is_fresh(self) -> bool:
        return self.leader is not None and self.elapsed < self.election_ticks[0]

    def _up_to_date(self, last_index: int, last_term: int) -> bool:
        return (last_term, last_index) >= (self.last_term(), self.last_index())

    def _pre_vote(self) -> None:
        self.role, self.leader = Role.PRE_CANDIDATE, None
        self.elapsed, self.timeout = 0, self._random_timeout()
        self.votes = {self.id}
        if len(self.votes) >= self.quorum():
            self._campaign()
            return
        for peer in self.voters():
            if peer != self.id:
                self._send(PreVote(self.term + 1, self.id, peer, self.last_index(), self.last_term()))

    def _campaign(self) -> None:
        self.term, self.vote = self.term + 1, None
        self._grant_vote(self.id)
        self.role, self.leader, self.votes = Role.CANDIDATE, None, {self.id}
        self.elapsed, self.timeout = 0, self._random_timeout()
        if len(self.votes) >= self.quorum():
            self._become_leader()
            return
        for peer in self.voters():
            if peer != self.id:
                self._send(Vote(self.term, self.id, peer, self.last_index(), self.last_term()),
                           after_persist=True)

    def _grant_vote(self, candidate: int) -> None:
        if self.vote is not None and self.vote != candidate:
            raise InvariantViolation(
                f"node {self.id} would vote for {candidate} in term {self.term} after voting {self.vote}")
        self.vote = candidate

    def _become_leader(self) -> None:
        self.role, self.leader = Role.LEADER, self.id
        self.elapsed = self.hb_elapsed = 0
        self.recent_active = set()
        self.progress = {p: Progress(next=self.last_index() + 1) for p in self.members if p != self.id}
        self.term_start = self.last_index() + 1
        self._append_local([Entry(self.term_start, self.term, EntryKind.NOOP)])

    def _check_quorum(self) -> None:
        """A leader that has not heard from a quorum in an election timeout steps down."""
        active = {p for p in self.recent_active if p in self.voters()}
        if self.id in self.voters():
            active.add(self.id)
        self.recent_active = set()
        if len(active) < self.quorum():
            self._become_follower(self.term, None)

    # ------------------------------------------------------------------ voting
    def _on_pre_vote(self, msg: PreVote) -> None:
        granted = (msg.term > self.term and msg.frm in self.members and not self._leader_is_fresh()
                   and self._up_to_date(msg.last_index, msg.last_term))
        self._send(PreVoteResp(msg.term if granted else self.term, self.id, msg.frm, granted))

    def _on_pre_vote_resp(self, msg: PreVoteResp) -> None:
        if self.role != Role.PRE_CANDIDATE or not msg.granted or msg.term != self.term + 1:
            return
        self.votes.add(msg.frm)
        if len(self.votes & set(self.voters())) >= self.quorum():
            self._campaign()

    def _on_vote(self, msg: Vote) -> None:
        granted = (self.vote in (None, msg.frm) and msg.frm in self.members
                   and self._up_to_date(msg.last_index, msg.last_term))
        if granted:
            self._grant_vote(msg.frm)
            self.elapsed = 0
        self._send(VoteResp(self.term, self.id, msg.frm, granted), after_persist=True)

    def _on_vote_resp(self, msg: VoteResp) -> None:
        if self.role != Role.CANDIDATE or not msg.granted:
            return
        self.votes.add(msg.frm)
        if len(self.votes & set(self.voters())) >= self.quorum():
            self._become_leader()

    # ------------------------------------------------------------- replication
    def _append_local(self, entries: list[Entry]) -> None:
        self.log.extend(entries)
        self._out.entries.extend(entries)
        self._on_appended(entries)
        for peer in self.progress:
            self._send_append(peer)

    def _on_appended(self, entries: list[Entry], announce: bool = True) -> None:
        """Configuration entries take effect as soon as they are in the log."""
        for e in entries:
            if e.kind == EntryKind.CONFIG and e.index > self.configs[-1][0]:
                self.configs.append((e.index, decode_members(e.data)))
                self._set_members(self.configs[-1][1], announce)

    def _set_members(self, members: Members, announce: bool = True) -> None:
        self.members = dict(members)
        if announce:
            self._out.members = dict(members)
        if self.role == Role.LEADER:
            for p in members:
                if p != self.id and p not in self.progress:
                    self.progress[p] = Progress(next=self.last_index() + 1)
            for p in [p for p in self.progress if p not in members]:
                del self.progress[p]

    def _truncate(self, index: int) -> None:
        """Drop entries >= index (uncommitted ones from a deposed leader)."""
        if index <= self.commit:
            raise InvariantViolation(f"node {self.id}: truncating committed entry {index} (commit {self.commit})")
        self.log = self.log[: index - self.offset_index - 1]
        self.stable = min(self.stable, index - 1)
        self._out.entries = [e for e in self._out.entries if e.index < index]
        t = self._out.truncate_from
        self._out.truncate_from = index if t is None else min(t, index)
        if self.configs[-1][0] >= index:
            while self.configs[-1][0] >= index:
                self.configs.pop()
            self._set_members(self.configs[-1][1])

    def _send_append(self, peer: int, heartbeat: bool = False) -> None:
        pr = self.progress[peer]
        last = self.last_index()
        if pr.flow == Flow.SNAPSHOT:
            if heartbeat:
                self._send_entries(peer, pr.match, [])
            return
        if pr.next - 1 < self.offset_index:
            pr.flow = Flow.SNAPSHOT
            self._out.send_snapshot.append(peer)
            return
        if pr.flow == Flow.PROBE:
            if not pr.probe_sent:
                hi = min(last, pr.next + self.max_batch - 1)
                self._send_entries(peer, pr.next - 1, self.entries(pr.next, hi))
                pr.probe_sent = True
            elif heartbeat:
                self._send_entries(peer, pr.match, [])
            return
        sent = False
        while pr.next <= last and pr.next - pr.match - 1 < self.max_inflight:
            hi = min(last, pr.next + self.max_batch - 1)
            self._send_entries(peer, pr.next - 1, self.entries(pr.next, hi))
            pr.next, sent = hi + 1, True
        if heartbeat and not sent:
            self._send_entries(peer, pr.match, [])

    def _send_entries(self, peer: int, prev: int, entries: list[Entry]) -> None:
        prev = max(prev, self.offset_index)  # a heartbeat to a peer that needs the snapshot
        ck_index, ck_value = max(self.checksums.items(), default=(0, 0))
        self._send(Append(self.term, self.id, peer, prev, self.term_at(prev) or 0, self.commit,
                          self.read_seq, ck_index, ck_value, entries))

    def _heartbeat(self) -> None:
        last = self.last_index()
        for peer, pr in self.progress.items():
            if pr.flow == Flow.REPLICATE and pr.match < last and pr.match == pr.last_hb_match:
                pr.stalls += 1
                if pr.stalls >= 3:  # an append was lost: resend from the last match
                    pr.flow, pr.next, pr.probe_sent = Flow.PROBE, pr.match + 1, False
            else:
                pr.stalls = 0
            pr.last_hb_match = pr.match
            if pr.flow == Flow.PROBE:
                pr.probe_sent = False
            self._send_append(peer, heartbeat=True)

    def _on_append(self, msg: Append) -> None:
        if self.role == Role.LEADER:
            raise InvariantViolation(f"nodes {self.id} and {msg.frm} both lead term {self.term}")
        if self.role != Role.FOLLOWER:
            self._become_follower(self.term, msg.frm)
        self.leader, self.elapsed = msg.frm, 0
        if msg.ck_index:
            self._compare_checksum((msg.ck_index, msg.ck_value))
            if msg.ck_index >= self.leader_ck[0]:
                self.leader_ck = (msg.ck_index, msg.ck_value)
        prev, prev_term, entries = msg.prev_index, msg.prev_term, msg.entries
        if prev < self.commit:  # the committed prefix matches the leader's by Log Matching
            entries = [e for e in entries if e.index > self.commit]
            prev, prev_term = self.commit, self.term_at(self.commit) or 0
        if self.term_at(prev) != prev_term:
            self._send(AppendResp(self.term, self.id, msg.frm, False, msg.prev_index,
                                  self._conflict_hint(prev), msg.seq))
            return
        fresh: list[Entry] = []
        for i, e in enumerate(entries):
            t = self.term_at(e.index)
            if t is None:
                fresh = entries[i:]
                break
            if t != e.term:
                self._truncate(e.index)
                fresh = entries[i:]
                break
        if fresh:
            self.log.extend(fresh)
            self._out.entries.extend(fresh)
            self._on_appended(fresh)
        last_new = prev + len(entries)
        if msg.commit > self.commit:
            self.commit = max(self.commit, min(msg.commit, last_new))
            self._ready_apply()
        self._send(AppendResp(self.term, self.id, msg.frm, True, last_new, 0, msg.seq), after_persist=True)

    def _conflict_hint(self, prev: int) -> int:
        if prev > self.last_index():
            return self.last_index()
        bad = self.term_at(prev)
        i = prev
        while i - 1 > max(self.commit, self.offset_index) and self.term_at(i - 1) == bad:
            i -= 1
        return max(i - 1, self.commit)

    def _on_append_resp(self, msg: AppendResp) -> None:
        pr = self.progress.get(msg.frm)
        if self.role != Role.LEADER or pr is None:
            return
        self.recent_active.add(msg.frm)
        pr.acked_seq = max(pr.acked_seq, msg.seq)
        if msg.success:
            if msg.index > pr.match:
                pr.match = msg.index
                pr.next = max(pr.next, msg.index + 1)
                if pr.flow == Flow.PROBE:
                    pr.flow = Flow.REPLICATE
                self._maybe_commit()
            elif pr.flow == Flow.PROBE and msg.index == pr.next - 1:
                pr.flow = Flow.REPLICATE
        elif pr.flow == Flow.SNAPSHOT:
            pass
        elif msg.index == pr.match and msg.hint < pr.match:  # it lost its log (a wiped data dir)
            pr.match, pr.next = msg.hint, msg.hint + 1
            pr.flow, pr.probe_sent = Flow.PROBE, False
        elif msg.index > pr.match and (pr.flow == Flow.REPLICATE or msg.index == pr.next - 1):
            pr.next = max(pr.match + 1, min(msg.index, msg.hint + 1))
            pr.flow, pr.probe_sent = Flow.PROBE, False
        if pr.flow != Flow.SNAPSHOT and self.role == Role.LEADER:
            self._send_append(msg.frm)
        self._release_reads()

    def _maybe_commit(self) -> None:
        matches = sorted((self.stable if p == self.id else self.progress[p].match) for p in self.voters()
                         if p == self.id or p in self.progress)
        if len(matches) < self.quorum():
            return
        n = matches[len(matches) - self.quorum()]
        if n > self.commit and self.term_at(n) == self.term:
            self.commit = n
            self._ready_apply()
            self._release_reads()
            if self.id not in self.members and self.configs[-1][0] <= self.commit:
                self._become_follower(self.term, None)  # removed ourselves: step aside

    def _ready_apply(self) -> None:
        hi = min(self.commit, self.stable)
        if hi > self.applying:
            self._out.apply.extend(self.entries(self.applying + 1, hi))
            self.applying = hi

    def _release_reads(self) -> None:
        if not self.pending_reads or self.commit < self.term_start:
            return
        others = sorted((pr.acked_seq for p, pr in self.progress.items() if p in self.voters()), reverse=True)
        need = self.quorum() - (1 if self.id in self.voters() else 0)
        confirmed = self.read_seq if need <= 0 else (others[need - 1] if len(others) >= need else 0)
        while self.pending_reads and self.pending_reads[0][0] <= confirmed:
            _, rid = self.pending_reads.pop(0)
            self._out.reads.append((rid, self.commit))

    def _compare_checksum(self, announced: tuple[int, int] | None = None) -> None:
        index, value = announced or self.leader_ck
        mine = self.checksums.get(index)
        if index and mine is not None and mine != value:
            raise InvariantViolation(
                f"node {self.id}: state checksum {mine:#x} at index {index} != leader's {value:#x}")
