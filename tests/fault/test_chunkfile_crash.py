"""kill -9 a real writer process mid-stream; every acknowledged shard must survive, nothing torn.

The group commit does not sync the shard index (the chunk bytes it syncs describe themselves): a kill -9 keeps
what the index wrote (the OS holds it), a power cut may not. The power-cut variants add a FAKE fault, as no power
can be cut here: after the kill, the index's write-ahead log is cut back to what it held when the writer began
(every index write of the run lost) or to a random byte between (a torn last record), which loses more than a real
cut could (the group commit syncs the log every second). Every acknowledged shard must still be there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from blobstore_server.libs.chunkfile import ChunkFile, ChunkId, Vuid, required_column_families
from blobstore_server.libs.kv import KVStore

ROOT = Path(__file__).resolve().parents[2]
VUID = Vuid.make(3, 0, 1)
WRITERS = 4
MIN_ACKS = 50

# The child puts shards from several threads and prints a bid only after put_shard returned; every other shard
# is written as a background one is (direct: O_DIRECT, page-aligned), among the others.
CHILD = """
import random, sys, threading
from pathlib import Path
from blobstore_server.libs.chunkfile import ChunkFile, ChunkId, required_column_families
from blobstore_server.libs.kv import KVStore

base, cid, first, writers = Path(sys.argv[1]), ChunkId.parse(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kv = KVStore(base / "meta", required_column_families())
path = base / "chunk"
chunk = ChunkFile.open(path, kv, cid) if path.exists() else ChunkFile.create(path, kv, cid)
out = threading.Lock()
wal = sorted((base / "meta").glob("[0-9]*.log"))[-1]
sys.stdout.write(f"ready {wal.name} {wal.stat().st_size}\\n")  # every index write so far is synced
sys.stdout.flush()

def size_of(bid):
    return bid * 7919 % 300_000

def run(k):
    bid = first + k
    while True:
        chunk.put_shard(bid, cid.vuid, random.Random(bid).randbytes(size_of(bid)), direct=bid % 2 == 0)
        with out:
            sys.stdout.write(f"{bid}\\n")
            sys.stdout.flush()
        bid += writers

threads = [threading.Thread(target=run, args=(k,)) for k in range(writers)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def size_of(bid: int) -> int:
    return bid * 7919 % 300_000


def payload(bid: int) -> bytes:
    return random.Random(bid).randbytes(size_of(bid))


def run_and_kill(base: Path, cid: ChunkId, first: int, power_cut: str | None = None) -> set[int]:
    """Start the writer, SIGKILL it by PID after MIN_ACKS acks; return every acknowledged bid. `power_cut` ("all",
    "torn"): then cut its index's log back (see the module's docstring)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(base), str(cid), str(first), str(WRITERS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    acked: set[int] = set()
    ready: list[bytes] = []
    enough = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(b"ready "):
                ready.extend(line.split()[1:])
            elif line.endswith(b"\n"):  # a cut-off last line was never fully acknowledged
                acked.add(int(line))
                if len(acked) >= MIN_ACKS:
                    enough.set()
        enough.set()  # EOF: the child died by itself; the caller checks

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        assert enough.wait(60), "writer produced too few acks"
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "writer exited"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        thread.join(30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert proc.returncode == -signal.SIGKILL
    if power_cut is not None:
        wal = base / "meta" / ready[0].decode()
        synced, written = int(ready[1]), wal.stat().st_size
        assert written > synced  # the run's index writes are in the log, unsynced
        os.truncate(wal, synced if power_cut == "all" else random.randrange(synced, written))
    return set(acked)


def check_reopened(base: Path, cid: ChunkId, acked: set[int], extra_bid: int) -> None:
    with KVStore(base / "meta", required_column_families()) as kv:
        chunk = ChunkFile.open(base / "chunk", kv, cid)
        try:
            for bid in sorted(acked):
                assert chunk.read_shard(bid) == payload(bid), bid
            indexed = chunk.list_shards()
            for meta in indexed:  # acknowledged or not, nothing indexed is torn
                chunk.verify_shard(meta.bid)
            assert acked <= {m.bid for m in indexed}
            assert os.path.getsize(chunk.path) == chunk.stats().write_offset
            chunk.put_shard(extra_bid, VUID, payload(extra_bid))
            assert chunk.read_shard(extra_bid) == payload(extra_bid)
        finally:
            chunk.close()


@pytest.mark.parametrize("power_cut", [None, "all", "torn"])
def test_kill_9_mid_stream_loses_no_acknowledged_shard(tmp_path: Path, power_cut: str | None) -> None:
    cid = ChunkId.new(VUID)
    acked = run_and_kill(tmp_path, cid, first=1, power_cut=power_cut)
    assert len(acked) >= MIN_ACKS
    check_reopened(tmp_path, cid, acked, extra_bid=10**9)
    # a second writer continues the recovered chunk and is killed again
    more = run_and_kill(tmp_path, cid, first=10**6, power_cut=power_cut)
    check_reopened(tmp_path, cid, acked | more, extra_bid=10**9 + 1)
