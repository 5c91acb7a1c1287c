"""An access node's state file (statefile.py): what it keeps, what a kill -9 and a torn last write leave of it, and
that no two processes share it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from blobstore_server.libs.proto.mqproxy import DeleteIn, RepairIn
from blobstore_server.libs.rpc import errors
from blobstore_server.libs.rpc.client import HttpClient, Request
from blobstore_server.libs.rpc.testing import FakeReply, FakeTransport
from blobstore_server.services.access.deadlines import read_clocks
from blobstore_server.services.access.outbox import Outbox
from blobstore_server.services.access.standby import Grant
from blobstore_server.services.access.statefile import SavedGrant, StateFile, StateFileInUse, on_disk
from blobstore_server.services.mqproxy.client import MqProxyClient
from tests.support.processes import REPO, free_port

CLUSTER = 1


def repair(bid: int) -> RepairIn:
    return RepairIn(vid=3, bid=bid, bad_indexes=[2], reason="put could not write these shards")


def saved_grant(first_bid: int, next_bid: int) -> SavedGrant:
    grant = Grant(vid=3, disks=(1, 2, 3), first_bid=first_bid, next_bid=next_bid, bids_left=100 - next_bid + first_bid,
                  bytes_left=1 << 20, usable_until=60.0)
    return SavedGrant.of(11, grant, 0.0, read_clocks())


def test_what_is_kept_comes_back_at_the_next_open_and_what_was_sent_or_dropped_does_not(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"

    async def first_run() -> None:
        state = StateFile(path)
        ids, saving = state.add_messages(CLUSTER, "repair", [repair(1), repair(2), repair(3)])
        await on_disk(saving)
        await on_disk(state.add_messages(2, "delete", [DeleteIn(vid=9, bid=5)])[1])
        await on_disk(state.sent(ids[:1]))
        await on_disk(state.save_grants(CLUSTER, [saved_grant(100, 100), saved_grant(500, 500)], []))
        await on_disk(state.save_grants(CLUSTER, [saved_grant(100, 117)], [500]))  # bids taken, a grant let go
        await asyncio.to_thread(state.close)

    asyncio.run(first_run())
    state = StateFile(path)
    try:
        assert state.messages(CLUSTER) == [(2, repair(2)), (3, repair(3))]
        assert state.messages(2) == [(4, DeleteIn(vid=9, bid=5))]
        assert [(g.first_bid, g.next_bid, g.bids_left) for g in state.grants(CLUSTER)] == [(100, 117, 83)]
        assert state.unclaimed() == []
        assert state.add_messages(CLUSTER, "repair", [repair(4)])[0] == [5]  # ids go on past the kept ones
    finally:
        state.close()


# Opens the state file, commits twenty repair messages one at a time (each waited for), says so, and waits.
WRITER = """
import asyncio, sys
from pathlib import Path
from blobstore_server.libs.proto.mqproxy import RepairIn
from blobstore_server.services.access.statefile import StateFile, on_disk

async def main() -> None:
    state = StateFile(Path(sys.argv[1]))
    for bid in range(1, 21):
        await on_disk(state.add_messages(1, "repair", [RepairIn(vid=3, bid=bid, bad_indexes=[2])])[1])
    print("written", flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


def killed_writer(path: Path) -> Path:
    """Run WRITER and kill -9 it once its commits are done (shown dead); the write-ahead log it left."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "written\n"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > 20 * 4096  # the commits are in the log, not yet copied into the file
    return wal


def kept_bids(path: Path) -> list[int]:
    state = StateFile(path)
    try:
        return [message.bid for _, message in state.messages(CLUSTER)]
    finally:
        state.close()


def test_every_commit_survives_a_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    killed_writer(path)
    assert kept_bids(path) == list(range(1, 21))


def test_a_torn_last_write_is_left_out_not_a_failed_start(tmp_path: Path) -> None:
    """FAKE power cut: the log is cut inside its last frame, or ends in bytes never written whole (a kill -9 leaves
    whole writes; only a power cut tears one, and there is no power to cut here)."""
    path = tmp_path / "state.sqlite"
    wal = killed_writer(path)
    with wal.open("r+b") as log:
        log.truncate(wal.stat().st_size - 1000)  # the last commit's frame, torn
    assert kept_bids(path) == list(range(1, 20))

    other = tmp_path / "other.sqlite"
    wal = killed_writer(other)
    with wal.open("ab") as log:
        log.write(os.urandom(3000))  # half a frame of garbage after the last commit
    assert kept_bids(other) == list(range(1, 21))


def test_a_second_process_on_the_same_file_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    state = StateFile(path)
    try:
        with pytest.raises(StateFileInUse, match=f"in use by process {os.getpid()}"):
            StateFile(path)
        config = tmp_path / "access.json"
        config.write_text(json.dumps({
            "bind_addr": f"127.0.0.1:{free_port()}", "insecure": True, "secret": "a-test-secret",
            "clustermgr_hosts": ["http://127.0.0.1:9"], "allocator_hosts": ["http://127.0.0.1:9"],
            "orphan_log": str(tmp_path / "orphans.jsonl"), "audit_log": "", "state_file": str(path)}))
        started = subprocess.run([sys.executable, "-m", "blobstore_server.services.access", "-c", str(config)],
                                 capture_output=True, text=True, timeout=60, cwd=REPO,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        assert started.returncode == 1
        assert (f"access: refusing to start: state file {path} is in use by process {os.getpid()}: every access "
                f"node needs a `state_file` of its own") in started.stderr
    finally:
        state.close()
    StateFile(path).close()  # free again once its holder let go


def test_the_outbox_keeps_each_message_in_the_file_until_mqproxy_takes_it(tmp_path: Path) -> None:
    """FAKE mqproxy (`libs.rpc.testing`), refusing in the first two runs, taking in the third: what each run of the
    outbox finds in the file (real processes and a kill -9: tests/fault/test_access_restart.py)."""
    path = tmp_path / "state.sqlite"
    taken: list[int] = []

    async def run(mqproxy_takes: bool, new: RepairIn | None) -> int:
        """One run of an access node's outbox: it queues `new`, flushes, stops; what it still holds."""
        async def mqproxy(request: Request) -> FakeReply:
            if not mqproxy_takes:
                return FakeReply.of(errors.Unavailable("Kafka did not confirm"))
            messages = json.loads(bytes(request.body or b""))["messages"]
            taken.extend(m["bid"] for m in messages)
            return FakeReply(200, json.dumps({"queued": len(messages)}).encode())

        state = StateFile(path)
        outbox = Outbox(MqProxyClient(["http://mq"], http=HttpClient(FakeTransport(mqproxy))), state, CLUSTER)
        if new is not None:
            await on_disk(outbox.repair(new))
        assert await outbox.flush() == mqproxy_takes
        await asyncio.to_thread(state.close)
        return len(outbox)

    assert asyncio.run(run(False, repair(1))) == 1
    assert asyncio.run(run(False, repair(2))) == 2  # the first taken up again, one more
    assert asyncio.run(run(True, None)) == 0
    assert taken == [1, 2]
    assert kept_bids(path) == []
