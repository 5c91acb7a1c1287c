"""RaftServer shells in one process over real localhost TCP, with a dict state machine:
the public API (propose, NotLeader, read_index, membership) and chunked snapshot transfer."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from blobstore_server.libs.raft.config import RaftConfig
from blobstore_server.libs.raft.errors import InvariantViolation, LeadershipLost, NotLeader
from blobstore_server.libs.raft.server import RaftServer
from blobstore_server.libs.raft.snapshot import Receiver, SnapshotStore
from tests.support.raftkv.kvcluster import free_port
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)


class DictMachine:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.bug = 0  # a test sets it to make this replica's state diverge

    def apply(self, index: int, command: bytes) -> bytes:
        key, _, value = command.decode().partition("=")
        self.data[key] = value
        return b"ok:%d" % index

    def snapshot(self, dest_dir: Path) -> None:
        dest_dir.mkdir(parents=True)
        (dest_dir / "data.json").write_text(json.dumps(self.data))

    def restore(self, src_dir: Path | None) -> None:
        self.data = json.loads((src_dir / "data.json").read_text()) if src_dir else {}

    def checksum(self) -> int:
        return zlib.crc32(json.dumps(self.data, sort_keys=True).encode()) + self.bug


def _config(tmp: Path, i: int, peers: dict[int, str], **kw: object) -> RaftConfig:
    return RaftConfig(node_id=i, peers=peers, data_dir=tmp / f"n{i}", heartbeat_ms=30,
                      election_ms=(150, 300), **kw)  # type: ignore[arg-type]


def _run(tmp: Path, body: Callable[[dict[int, RaftServer], dict[int, str]], Awaitable[None]],
         **kw: object) -> None:
    async def main() -> None:
        peers = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
        servers = {i: RaftServer(_config(tmp, i, peers, **kw), DictMachine()) for i in peers}
        try:
            for s in servers.values():
                await s.start()
            await body(servers, peers)
        finally:
            for s in servers.values():
                await s.stop()

    asyncio.run(main())


async def _leader(servers: dict[int, RaftServer]) -> RaftServer:
    await eventually(lambda: any(s.is_leader() for s in servers.values()), 10, "a leader")
    return next(s for s in servers.values() if s.is_leader())


def test_propose_read_and_not_leader(tmp_path: Path) -> None:
    async def body(servers: dict[int, RaftServer], peers: dict[int, str]) -> None:
        lead = await _leader(servers)
        results = await asyncio.gather(*(lead.propose(b"k%d=v" % i) for i in range(100)))
        assert len(set(results)) == 100 and all(r.startswith(b"ok:") for r in results)
        index = await lead.read_index()
        assert lead.applied >= index >= 100
        follower = next(s for s in servers.values() if s is not lead)
        with pytest.raises(NotLeader) as err:
            await follower.propose(b"x=y")
        assert err.value.leader_hint == lead.node.id
        await eventually(lambda: any([follower.applied >= index]), 5, "follower apply")
        assert follower.sm.data == lead.sm.data  # type: ignore[attr-defined]

    _run(tmp_path, body)


def test_followers_answer_heartbeats_without_a_synced_write(tmp_path: Path) -> None:
    """A heartbeat brings nothing durable, so a follower acks it at once: ~33 heartbeats in a second of rest
    cost no fsync (each cost one before), while every entry still reaches every log before it is acked."""

    async def body(servers: dict[int, RaftServer], peers: dict[int, str]) -> None:
        lead = await _leader(servers)
        await lead.propose(b"k=v")
        followers = [s for s in servers.values() if s is not lead]
        await eventually(lambda: any([all(f.applied == lead.applied for f in followers)]), 5, "caught up")
        resting = [f.log_writes for f in followers]
        await asyncio.sleep(1.0)
        assert [f.log_writes for f in followers] == resting
        await lead.propose(b"k=w")
        index = lead.applied
        await eventually(lambda: any([all(f.storage.last >= index for f in followers if f.storage)]), 5,
                       "the entry in every log")
        # the count goes up once the write's thread hands back to the loop, just after the log shows the entry
        await eventually(lambda: any([all(f.log_writes > w for f, w in zip(followers, resting, strict=True))]), 5,
                       "a synced write for it on every follower")

    _run(tmp_path, body)


def test_a_cut_off_leader_answers_its_pending_proposals_and_new_ones_at_once(tmp_path: Path) -> None:
    async def body(servers: dict[int, RaftServer], peers: dict[int, str]) -> None:
        lead = await _leader(servers)
        await lead.propose(b"before=1")
        for s in servers.values():
            if s is not lead:
                await s.stop()  # the leader is alone: nothing it proposes can commit
        started = time.monotonic()
        with pytest.raises(LeadershipLost, match="may still commit"):
            await lead.propose(b"stranded=1")
        assert time.monotonic() - started < 2 * 0.3 + 0.3  # check-quorum, not the 5 s propose timeout
        with pytest.raises(NotLeader):
            await lead.propose(b"later=1")

    _run(tmp_path, body)


def test_new_member_catches_up_through_chunked_snapshot(tmp_path: Path) -> None:
    async def body(servers: dict[int, RaftServer], peers: dict[int, str]) -> None:
        lead = await _leader(servers)
        for i in range(0, 400, 50):
            await asyncio.gather(*(lead.propose(b"k%d=%s" % (j, b"x" * 200)) for j in range(i, i + 50)))
        await eventually(lambda: any([lead.node.offset_index > 0]), 10, "log compaction")
        addr = f"127.0.0.1:{free_port()}"
        cfg = RaftConfig(node_id=4, peers=peers, data_dir=tmp_path / "n4", listen=addr, join=True,
                         heartbeat_ms=30, election_ms=(150, 300), snapshot_chunk=1024)
        new = servers[4] = RaftServer(cfg, DictMachine())
        await new.start()
        await lead.add_learner(4, addr)
        await eventually(lambda: any([new.applied >= lead.applied]), 10, "the learner to catch up")
        assert new.node.snapshot.index > 0
        assert new.sm.data == lead.sm.data  # type: ignore[attr-defined]
        await lead.promote(4)
        assert new.node.id in lead.node.voters()

    _run(tmp_path, body, snapshot_threshold=100, snapshot_keep=10)


def test_diverged_replica_stops_on_checksum_mismatch(tmp_path: Path) -> None:
    async def body(servers: dict[int, RaftServer], peers: dict[int, str]) -> None:
        lead = await _leader(servers)
        bad = next(s for s in servers.values() if s is not lead)
        bad.sm.bug = 1  # type: ignore[attr-defined]
        await asyncio.gather(*(lead.propose(b"k%d=v" % i) for i in range(30)))
        fatal = await asyncio.wait_for(bad.wait_fatal(), 10)
        assert isinstance(fatal, InvariantViolation) and "checksum" in str(fatal)
        assert all(s._fatal is None for s in servers.values() if s is not bad)

    _run(tmp_path, body, checksum_interval=10)


def test_snapshot_receiver_resumes_at_its_offset(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snap")
    recv = Receiver(store, 10, 2)
    recv.write(0, b"abc")
    recv.write(10, b"zzz")  # out of order: ignored, the sender is told to resume at 3
    assert recv.size == 3
    again = Receiver(store, 10, 2)  # a new stream (or a restart) resumes the partial file
    assert again.size == 3
    again.write(3, b"def")
    assert again.finish().read_bytes() == b"abcdef"
