"""A fake network and fake disks that run many `RaftNode` cores in one process.

For tests only: the simulated shell follows the `Output` contract exactly (persist, then send the
after-persist messages, then report `persisted`), but writes reach its fake disk only when the
schedule flushes it, so a crash loses unflushed writes as a real power cut would. The network
drops, delays, duplicates and reorders messages and can partition nodes. A paused node (SIGSTOP,
a long GC or disk stall) keeps its state but neither ticks nor reads: messages to it wait until
it resumes.
"""

from __future__ import annotations

import heapq
import random
import zlib
from dataclasses import dataclass, field

from blobstore_server.libs.raft.core import RaftNode
from blobstore_server.libs.raft.errors import NotLeader, RaftError
from blobstore_server.libs.raft.messages import AppendResp, Entry, EntryKind, Member, Members, Message, SnapshotMeta
from blobstore_server.libs.raft.output import Output, Role


@dataclass
class FakeDisk:
    term: int = 0
    vote: int | None = None
    commit: int = 0
    offset: tuple[int, int] = (0, 0)
    log: dict[int, Entry] = field(default_factory=dict)
    snapshot: SnapshotMeta | None = None
    snapshot_state: list[Entry] = field(default_factory=list)

    def write(self, out: Output) -> None:
        if out.hard_state:
            self.term, self.vote = out.hard_state.term, out.hard_state.vote
        self.commit = max(self.commit, out.commit)
        if out.log_reset is not None:
            self.log.clear()
            self.offset = out.log_reset
        if out.truncate_from is not None:
            for i in [i for i in self.log if i >= out.truncate_from]:
                del self.log[i]
        for e in out.entries:
            self.log[e.index] = e
        if out.compact_to is not None and out.compact_to[0] > self.offset[0]:
            self.offset = out.compact_to
            for i in [i for i in self.log if i <= out.compact_to[0]]:
                del self.log[i]


@dataclass
class SimNode:
    id: int
    core: RaftNode
    disk: FakeDisk
    state: list[Entry]  # the state machine: every applied entry, in order
    pending: list[Output] = field(default_factory=list)
    alive: bool = True
    paused: bool = False
    held: list[Message] = field(default_factory=list)  # sent to it while paused, read on resume
    reads: list[tuple[int, int]] = field(default_factory=list)  # confirmed (request id, read index)
    ticks: int = 0  # its own clock: ticks it has run (none while paused or down)
    heard: dict[int, int] = field(default_factory=dict)  # as leader: peer -> tick of its last answer this term
    members_at: int = 0  # tick at which its member set last changed

    def checksum(self) -> int:
        ck = 0
        for e in self.state:
            ck = zlib.crc32(e.data, ck)
        return ck


@dataclass(order=True)
class _InFlight:
    at: int
    seq: int
    msg: Message = field(compare=False)


class FakeNetwork:
    """Cluster of simulated nodes. Checks safety as it runs (raises AssertionError)."""

    def __init__(self, n: int, seed: int = 0, *, drop: float = 0.0, dup: float = 0.0, max_delay: int = 1,
                 flush_prob: float = 1.0, snapshot_every: int = 0, keep: int = 3, learners: int = 0,
                 checksum_interval: int = 10) -> None:
        self.rng = random.Random(seed)
        self.drop, self.dup, self.max_delay, self.flush_prob = drop, dup, max_delay, flush_prob
        self.snapshot_every, self.keep, self.checksum_interval = snapshot_every, keep, checksum_interval
        self.now = 0
        self._seq = 0
        self.inflight: list[_InFlight] = []
        self.cut: set[frozenset[int]] = set()
        members: Members = {i: Member(f"n{i}", voter=i <= n) for i in range(1, n + 1)}
        self.initial = SnapshotMeta(0, 0, members)
        self.nodes: dict[int, SimNode] = {}
        for i in range(1, n + learners + 1):
            snap = self.initial if i <= n else SnapshotMeta(0, 0, {})
            self.nodes[i] = SimNode(i, self._core(i, FakeDisk(snapshot=snap)), FakeDisk(snapshot=snap), [])
        self.leaders: dict[int, int] = {}  # term -> leader
        self.lead_since: dict[int, tuple[int, int]] = {}  # node -> (term, tick) it took the lead
        self.committed: dict[int, Entry] = {}  # index -> the entry every node applied there
        self.acked: list[bytes] = []  # proposals a leader saw committed and applied

    def _core(self, i: int, disk: FakeDisk) -> RaftNode:
        assert disk.snapshot is not None
        entries = [disk.log[k] for k in sorted(disk.log)]
        return RaftNode(i, disk.snapshot, term=disk.term, vote=disk.vote, commit=disk.commit,
                        offset=disk.offset, entries=entries, election_ticks=(10, 20), heartbeat_ticks=2,
                        max_batch=4, max_inflight=16, checksum_interval=self.checksum_interval,
                        rng=random.Random(self.rng.random()))

    # ------------------------------------------------------------------ schedule
    def partition(self, *groups: set[int]) -> None:
        """Cut every link between different groups."""
        self.cut = {frozenset((a, b)) for g in groups for h in groups if g is not h for a in g for b in h}

    def heal(self) -> None:
        self.cut = set()

    def crash(self, i: int) -> None:
        node = self.nodes[i]
        node.alive, node.pending, node.paused, node.held = False, [], False, []

    def pause(self, i: int) -> None:
        self.nodes[i].paused = True

    def resume(self, i: int) -> None:
        """It reads what queued up while it was stopped, in order, before its next tick."""
        node = self.nodes[i]
        node.paused = False
        held, node.held = node.held, []
        for msg in held:
            self._seq += 1
            heapq.heappush(self.inflight, _InFlight(self.now + 1, self._seq, msg))

    def restart(self, i: int, wipe: bool = False) -> None:
        node = self.nodes[i]
        if wipe:
            node.disk = FakeDisk(snapshot=self.initial if i in self.initial.members else SnapshotMeta(0, 0, {}))
        node.core = self._core(i, node.disk)
        node.state = list(node.disk.snapshot_state)
        node.alive = True
        self._drain(node)

    def leader(self) -> SimNode | None:
        leads = [n for n in self.nodes.values() if n.alive and n.core.role == Role.LEADER]
        return max(leads, key=lambda n: n.core.term, default=None)

    def propose(self, data: bytes) -> bool:
        node = self.leader()
        if node is None:
            return False
        try:
            node.core.propose([data])
        except NotLeader:
            return False
        self._drain(node)
        return True

    def change(self, members: Members) -> bool:
        node = self.leader()
        if node is None:
            return False
        try:
            node.core.propose_config(members)
        except RaftError:
            return False
        self._drain(node)
        return True

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step()

    def step(self) -> None:
        """One tick of simulated time."""
        self.now += 1
        while self.inflight and self.inflight[0].at <= self.now:
            f = heapq.heappop(self.inflight)
            self._deliver(f.msg)
        for node in self.nodes.values():
            if node.alive and not node.paused:
                node.ticks += 1
                node.core.tick()
                self._drain(node)
                if node.pending and self.rng.random() < self.flush_prob:
                    self._flush(node)
        self._check_leaders()

    def settle(self, max_ticks: int = 2000) -> None:
        """Heal, resume, flush everything and run until all live nodes applied the same commit."""
        self.heal()
        for i, node in self.nodes.items():
            if node.paused:
                self.resume(i)
        self.drop = self.dup = 0.0
        self.flush_prob = 1.0
        for _ in range(max_ticks):
            self.step()
            lead = self.leader()
            if lead and all(n.core.applied == lead.core.last_index() for n in self.members()):
                return
        raise AssertionError("cluster did not converge")

    def members(self) -> list[SimNode]:
        """Live nodes in the current leader's configuration."""
        lead = self.leader()
        return [n for n in self.nodes.values() if n.alive and lead and n.id in lead.core.members]

    # --------------------------------------------------------------- internals
    def _send(self, msg: Message) -> None:
        lost = frozenset((msg.frm, msg.to)) in self.cut or self.rng.random() < self.drop
        if lost and not isinstance(msg, _SnapshotTransfer):  # a lost transfer is reported on delivery
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            self._seq += 1
            heapq.heappush(self.inflight, _InFlight(self.now + self.rng.randint(1, self.max_delay), self._seq, msg))

    def _deliver(self, msg: Message) -> None:
        node = self.nodes.get(msg.to)
        if isinstance(msg, _SnapshotTransfer):
            sender = self.nodes[msg.frm]
            if node and node.alive and not node.paused and frozenset((msg.frm, msg.to)) not in self.cut:
                self._install(node, msg)
            elif sender.alive:  # the stream failed: the shell would report it
                sender.core.snapshot_sent(msg.to, False)
                self._drain(sender)
            return
        if node is None or not node.alive:
            return
        if node.paused:
            node.held.append(msg)
            return
        if isinstance(msg, AppendResp) and node.core.role == Role.LEADER and msg.term == node.core.term:
            node.heard[msg.frm] = node.ticks
        node.core.step(msg)
        self._drain(node)

    def _install(self, node: SimNode, msg: _SnapshotTransfer) -> None:
        sender = self.nodes[msg.frm]
        if node.core.install_snapshot(msg.term, msg.frm, msg.meta):
            node.disk.snapshot, node.disk.snapshot_state = msg.meta, list(msg.state)
            node.state = list(msg.state)
        if sender.alive:
            sender.core.snapshot_sent(node.id, True)
            self._drain(sender)
        self._drain(node)

    def _drain(self, node: SimNode) -> None:
        out = node.core.take_output()
        if out.members is not None:
            node.members_at = node.ticks
        waits = out.needs_persist(earlier_unwritten=bool(node.pending))
        for msg in out.send if waits else [*out.send, *out.send_after_persist]:
            self._send(msg)
        node.reads += out.reads
        if waits:
            node.pending.append(out)
        for e in out.apply:
            self._apply(node, e)
        for peer in out.send_snapshot:
            meta, state = node.disk.snapshot, node.disk.snapshot_state
            assert meta is not None
            self._send(_SnapshotTransfer(node.core.term, node.id, peer, meta, state))
        if self.flush_prob >= 1.0 and node.pending:
            self._flush(node)
        if out.apply and self.snapshot_every and node.core.applied - node.core.snapshot.index >= self.snapshot_every:
            meta = node.core.snapshot_meta(node.core.applied)
            node.disk.snapshot, node.disk.snapshot_state = meta, list(node.state)
            node.core.compact(meta, self.keep)
            self._drain(node)

    def _flush(self, node: SimNode) -> None:
        pending, node.pending = node.pending, []
        last: Entry | None = None
        for out in pending:
            node.disk.write(out)
            last = out.entries[-1] if out.entries else last
        for out in pending:
            for msg in out.send_after_persist:
                self._send(msg)
        if last is not None:
            node.core.persisted(last.index, last.term)
            self._drain(node)

    def _apply(self, node: SimNode, e: Entry) -> None:
        seen = self.committed.setdefault(e.index, e)
        assert seen == e, f"node {node.id} applied {e} where another applied {seen}"
        node.state.append(e)
        assert len(node.state) == e.index, f"node {node.id} state has {len(node.state)} entries at {e.index}"
        interval = node.core.checksum_interval
        node.core.on_applied(e.index, node.checksum() if e.index % interval == 0 else None)
        if node.core.role == Role.LEADER and e.term == node.core.term and e.kind == EntryKind.NORMAL:
            self.acked.append(e.data)

    def _check_leaders(self) -> None:
        for node in self.nodes.values():
            if node.alive and node.core.role == Role.LEADER:
                other = self.leaders.setdefault(node.core.term, node.id)
                assert other == node.id, f"two leaders in term {node.core.term}: {other} and {node.id}"
                self._check_quorum_contact(node)

    def _check_quorum_contact(self, node: SimNode) -> None:
        """Check-quorum, checked from outside: a leader that has not heard from a quorum for two
        minimum election timeouts of its own ticks must have stepped down (it checks once per
        timeout, over the timeout just past). Not judged within two timeouts of a membership change,
        which the next check only then sees."""
        core = node.core
        term, since = self.lead_since.get(node.id, (-1, 0))
        if term != core.term:
            since = node.ticks
            self.lead_since[node.id] = (core.term, since)
            node.heard = {}
        window = 2 * core.election_ticks[0]
        peers = [p for p in core.voters() if p != node.id]
        need = core.quorum() - (1 if node.id in core.voters() else 0)
        if need <= 0 or node.ticks - node.members_at < window:
            return
        contacts = sorted((max(since, node.heard.get(p, since)) for p in peers), reverse=True)
        last = contacts[need - 1]
        assert node.ticks - last < window, (
            f"node {node.id} still leads term {term} {node.ticks - last} ticks after it last heard from a quorum")


@dataclass(slots=True)
class _SnapshotTransfer(Message):
    """The whole snapshot as one message (the real shell streams it in chunks)."""

    meta: SnapshotMeta = field(default_factory=lambda: SnapshotMeta(0, 0))
    state: list[Entry] = field(default_factory=list)
