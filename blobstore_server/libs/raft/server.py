"""The asyncio shell around `RaftNode`: it moves bytes (network, disk) and applies entries.

Everything that touches the core runs on the event loop, so the core needs no locks. The only
work off the loop is the synced log write (a thread), which gathers every output queued while
the previous write was in flight: group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from blobstore_server.libs.raft.config import RaftConfig
from blobstore_server.libs.raft.core import RaftNode
from blobstore_server.libs.raft.errors import InvariantViolation, LeadershipLost, NotLeader, ProposalDropped, RaftError
from blobstore_server.libs.raft.log import RaftLog
from blobstore_server.libs.raft.messages import (
    Entry,
    EntryKind,
    Member,
    Members,
    Message,
    SnapAck,
    SnapChunk,
    SnapshotMeta,
)
from blobstore_server.libs.raft.output import Output, Role
from blobstore_server.libs.raft.snapshot import Receiver, SnapshotStore, read_meta
from blobstore_server.libs.raft.transport import Transport

log = logging.getLogger(__name__)


class StateMachine(Protocol):
    """What the application replicates. Called on the event loop, in log order."""

    def apply(self, index: int, command: bytes) -> bytes: ...

    def snapshot(self, dest_dir: Path) -> None:
        """Write the state as of the last applied index into the empty `dest_dir`."""

    def restore(self, src_dir: Path | None) -> None:
        """Replace the state with a snapshot's (None: the empty state)."""

    def checksum(self) -> int:
        """A 64-bit digest of the state, equal on replicas at the same applied index."""


class RaftServer:
    def __init__(self, config: RaftConfig, state_machine: StateMachine) -> None:
        self.config = config
        self.sm = state_machine
        self.core: RaftNode | None = None
        self.applied = 0
        self._pending: list[Output] = []
        self._writing = False  # a batch taken from _pending is being written
        self.log_writes = 0  # synced writes to the log, each one fsync
        self._wake_writer = asyncio.Event()
        self._proposals: list[tuple[bytes, asyncio.Future[bytes]]] = []
        self._flush_scheduled = False
        self._waiters: dict[int, tuple[int, asyncio.Future[bytes]]] = {}
        self._reads: dict[int, asyncio.Future[int]] = {}
        self._apply_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._read_ids = itertools.count(1)
        self._snap_acks: dict[int, asyncio.Queue[SnapAck]] = {}
        self._receiver: Receiver | None = None
        self._snapshotting = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fatal: BaseException | None = None
        self._died = asyncio.Event()
        key = bytes.fromhex(config.member_key) if config.member_key else None
        self.transport = Transport(config.node_id, config.listen_addr, self._on_message, key, config.tls)
        self.snapshots = SnapshotStore(config.data_dir / "snap")
        self.storage: RaftLog | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        cfg = self.config
        self.storage = RaftLog(cfg.data_dir / "raft", fsync=cfg.fsync)
        stored = self.storage.load()
        latest = self.snapshots.latest()
        if latest:
            meta, path = latest
            self.sm.restore(self.snapshots.unpack(path))
        else:
            initial = {} if cfg.join else {i: Member(a) for i, a in cfg.peers.items()}
            meta = SnapshotMeta(0, 0, initial)
            self.sm.restore(None)
        self.applied = meta.index
        self.core = RaftNode(
            cfg.node_id, meta, term=stored.term, vote=stored.vote, commit=stored.commit, offset=stored.offset,
            entries=stored.entries, election_ticks=(cfg.ticks(cfg.election_ms[0]), cfg.ticks(cfg.election_ms[1])),
            heartbeat_ticks=cfg.ticks(cfg.heartbeat_ms), max_batch=cfg.max_batch, max_inflight=cfg.max_inflight,
            checksum_interval=cfg.checksum_interval, rng=random.Random())
        await self.transport.start()
        self._spawn(self._ticker())
        self._spawn(self._writer())
        self._guard(None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.transport.close()
        if self.storage:
            self.storage.close()

    async def wait_fatal(self) -> BaseException:
        """Returns when the node hit an invariant violation (the caller should exit loudly)."""
        await self._died.wait()
        assert self._fatal is not None
        return self._fatal

    # -------------------------------------------------------------- public API
    @property
    def node(self) -> RaftNode:
        assert self.core is not None, "start() first"
        return self.core

    def is_leader(self) -> bool:
        return self.node.role == Role.LEADER

    async def propose(self, command: bytes) -> bytes:
        """Replicate `command`; returns the state machine's result once it is committed and
        applied here. Raises NotLeader, ProposalDropped (never applied), or LeadershipLost or
        TimeoutError (outcome unknown)."""
        if not self.is_leader():
            raise NotLeader(self.node.leader)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._proposals.append((command, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_proposals)
        return await asyncio.wait_for(fut, self.config.propose_timeout)

    async def read_index(self) -> int:
        """Linearizable read barrier: once this returns, the local state machine reflects every
        write acknowledged before the call. Leader only (ReadIndex, Raft thesis 6.4)."""
        rid = next(self._read_ids)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reads[rid] = fut
        try:
            self._guard(lambda: self.node.read_index(rid))
            index = await asyncio.wait_for(fut, self.config.propose_timeout)
        finally:
            self._reads.pop(rid, None)
        await self.wait_applied(index)
        return index

    async def wait_applied(self, index: int) -> None:
        if self.applied >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._apply_waiters.append((index, fut))
        await asyncio.wait_for(fut, self.config.propose_timeout)

    async def add_learner(self, node_id: int, addr: str) -> None:
        await self._change({**self.node.members, node_id: Member(addr, voter=False)})

    async def promote(self, node_id: int) -> None:
        member = self.node.members.get(node_id)
        if member is None:
            raise RaftError(f"node {node_id} is not a member")
        await self._change({**self.node.members, node_id: Member(member.addr, voter=True)})

    async def remove(self, node_id: int) -> None:
        await self._change({k: v for k, v in self.node.members.items() if k != node_id})

    def status(self) -> dict[str, Any]:
        c = self.node
        return {
            "id": c.id, "role": c.role.value, "term": c.term, "leader": c.leader, "commit": c.commit,
            "applied": self.applied, "last_index": c.last_index(), "snapshot_index": c.snapshot.index,
            "log_writes": self.log_writes,
            "members": {str(k): {"addr": m.addr, "voter": m.voter} for k, m in c.members.items()},
        }

    async def _change(self, members: Members) -> None:
        index, term = self.node.propose_config(members)
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiters[index] = (term, fut)
        self._guard(None)
        await asyncio.wait_for(fut, self.config.propose_timeout)

    # ---------------------------------------------------------------- events
    def _flush_proposals(self) -> None:
        self._flush_scheduled = False
        batch, self._proposals = self._proposals, []
        live = [(c, f) for c, f in batch if not f.done()]
        if not live:
            return
        try:
            slots = self.node.propose([c for c, _ in live])
        except NotLeader as e:
            for _, f in live:
                f.set_exception(NotLeader(e.leader_hint))
            return
        for (index, term), (_, fut) in zip(slots, live, strict=True):
            self._waiters[index] = (term, fut)
        self._guard(None)

    async def _ticker(self) -> None:
        interval = self.config.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            # After a stall, tick once, not once per missed interval: a burst of ticks would
            # expire election timers before the heartbeats queued meanwhile are read.
            next_at = max(next_at + interval, loop.time())
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self._guard(self.node.tick)

    def _on_message(self, msg: Message) -> None:
        if isinstance(msg, SnapChunk):
            self._guard(lambda: self._on_snap_chunk(msg))
        elif isinstance(msg, SnapAck):
            queue = self._snap_acks.get(msg.frm)
            if queue is not None:
                queue.put_nowait(msg)
        else:
            self._guard(lambda: self.node.step(msg))

    def _guard(self, event: Callable[[], None] | None) -> None:
        """Run a core event and carry out its output; an invariant violation is fatal."""
        if self._fatal is not None:
            raise self._fatal
        try:
            if event is not None:
                event()
            self._process()
        except InvariantViolation as e:
            self._die(e)
            raise

    def _die(self, e: InvariantViolation) -> None:
        self._fatal = e
        self._died.set()
        log.critical("raft invariant violated on node %s: %s", self.config.node_id, e)

    # ------------------------------------------------------------ instructions
    def _process(self) -> None:
        out = self.node.take_output()
        if out.members is not None:
            self.transport.set_peers({i: m.addr for i, m in out.members.items()})
        if out.restore is not None:
            self._restore(out.restore)
        waits = out.needs_persist(earlier_unwritten=bool(self._pending) or self._writing)
        if waits:
            self._pending.append(out)
            self._wake_writer.set()
        for msg in out.send if waits else [*out.send, *out.send_after_persist]:
            self.transport.send(msg)
        for e in out.apply:
            self._apply(e)
        if out.apply:
            self._wake_apply_waiters()
            self._maybe_snapshot()
        for peer in out.send_snapshot:
            self._spawn(self._send_snapshot(peer))
        for rid, index in out.reads:
            fut = self._reads.get(rid)
            if fut is not None and not fut.done():
                fut.set_result(index)
        for rid in out.reads_failed:
            fut = self._reads.get(rid)
            if fut is not None and not fut.done():
                fut.set_exception(NotLeader(self.node.leader))
        if self._waiters and self.node.role != Role.LEADER:
            self._fail_waiters()

    def _fail_waiters(self) -> None:
        """A deposed leader (a higher term, or check-quorum) answers its proposals at once instead
        of letting them time out: whether they commit is up to the next leader."""
        waiters, self._waiters = self._waiters, {}
        for index, (_, fut) in waiters.items():
            if not fut.done():
                fut.set_exception(LeadershipLost(f"node {self.config.node_id} stopped leading before entry {index}"
                                                 " committed; it may still commit"))

    async def _writer(self) -> None:
        assert self.storage is not None
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            self._writing = True
            try:
                self.log_writes += await asyncio.to_thread(self.storage.write, batch)
            except InvariantViolation as e:
                self._die(e)
                raise
            for out in batch:
                for msg in out.send_after_persist:
                    self.transport.send(msg)
            self._writing = False
            last = next((out.entries[-1] for out in reversed(batch) if out.entries), None)
            if last is not None:
                self._guard(lambda e=last: self.node.persisted(e.index, e.term))  # type: ignore[misc]

    def _apply(self, e: Entry) -> None:
        if e.index != self.applied + 1:
            raise InvariantViolation(f"node {self.config.node_id}: applying {e.index} after {self.applied}")
        result = self.sm.apply(e.index, e.data) if e.kind == EntryKind.NORMAL else b""
        self.applied = e.index
        interval = self.config.checksum_interval
        self.node.on_applied(e.index, self.sm.checksum() if e.index % interval == 0 else None)
        waiter = self._waiters.pop(e.index, None)
        if waiter is not None and not waiter[1].done():
            term, fut = waiter
            if term == e.term:
                fut.set_result(result)
            else:
                fut.set_exception(ProposalDropped(f"entry {e.index} of term {term} was replaced"))

    def _wake_apply_waiters(self) -> None:
        if not self._apply_waiters:
            return
        ready = [w for w in self._apply_waiters if w[0] <= self.applied]
        self._apply_waiters = [w for w in self._apply_waiters if w[0] > self.applied]
        for _, fut in ready:
            if not fut.done():
                fut.set_result(None)

    # --------------------------------------------------------------- snapshots
    def _maybe_snapshot(self) -> None:
        if self._snapshotting or self.applied - self.node.snapshot.index < self.config.snapshot_threshold:
            return
        self._snapshotting = True
        meta = self.node.snapshot_meta(self.applied)
        work = self.snapshots.work_dir(f"take-{meta.index}")
        self.sm.snapshot(work / "state")  # on the loop: captures exactly `applied`
        self._spawn(self._finish_snapshot(work, meta))

    async def _finish_snapshot(self, work: Path, meta: SnapshotMeta) -> None:
        try:
            path = await asyncio.to_thread(self.snapshots.pack, work, meta)
            if meta.index > self.node.snapshot.index:
                self._guard(lambda: self.node.compact(meta, self.config.snapshot_keep))
                self.snapshots.prune(keep=path)
        finally:
            self._snapshotting = False

    def _restore(self, meta: SnapshotMeta) -> None:
        path = self.snapshots.path_for(meta.index, meta.term)
        self.sm.restore(self.snapshots.unpack(path))
        self.applied = meta.index
        self.snapshots.prune(keep=path)
        self._wake_apply_waiters()

    async def _send_snapshot(self, peer: int) -> None:
        """Stream the latest snapshot to `peer`, one acknowledged chunk at a time; the receiver
        answers with the offset it holds, so a broken transfer resumes where it stopped."""
        ok = False
        queue = self._snap_acks[peer] = asyncio.Queue()
        try:
            latest = self.snapshots.latest()
            if latest is None:
                return
            meta, path = latest
            with open(path, "rb") as f:
                total = f.seek(0, 2)
                offset = 0
                while not ok:
                    f.seek(offset)
                    data = f.read(self.config.snapshot_chunk)
                    self.transport.send(SnapChunk(self.node.term, self.node.id, peer, meta.index, meta.term,
                                                  offset, total, data))
                    ack = await asyncio.wait_for(queue.get(), 2.0)
                    while ack.index != meta.index:
                        ack = await asyncio.wait_for(queue.get(), 2.0)
                    ok, offset = ack.done, ack.next_offset
        except (TimeoutError, OSError) as e:
            log.info("snapshot to %s failed: %r", peer, e)
        finally:
            if self._snap_acks.get(peer) is queue:
                del self._snap_acks[peer]
            self._guard(lambda: self.node.snapshot_sent(peer, ok))

    def _on_snap_chunk(self, msg: SnapChunk) -> None:
        c = self.node
        if msg.term < c.term:
            return
        recv = self._receiver
        if recv is None or (recv.index, recv.term) != (msg.index, msg.snap_term):
            recv = self._receiver = Receiver(self.snapshots, msg.index, msg.snap_term)
        recv.write(msg.offset, msg.data)
        done = False
        size = recv.size
        if size >= msg.total:
            self._receiver = None
            path = recv.finish()
            try:
                meta = read_meta(path)
            except (OSError, KeyError, ValueError, tarfile.TarError) as e:
                log.warning("received snapshot %s is unreadable (%r): fetching it again", path, e)
                path.unlink(missing_ok=True)
                size = 0
            else:
                done = True
                installed = c.install_snapshot(msg.term, msg.frm, meta)
                if not installed and c.snapshot.index != msg.index:
                    path.unlink(missing_ok=True)
        self.transport.send(SnapAck(c.term, c.id, msg.frm, msg.index, size, done))
