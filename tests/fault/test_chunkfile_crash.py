"""kill -9 a real writer process mid-stream; every acknowledged shard must survive, nothing torn.

The group commit does not sync the shard index (the chunk bytes it syncs describe themselves): a kill -9 keeps
what the index wrote (the OS holds it), a power cut may not. The power-cut variants add a FAKE fault, as no power
can be cut here: after the kill, the index's write-ahead log is cut back to what it held when the writer began
(every index write of the run lost) or to a random byte between (a torn last record), which loses more than a real
cut could (the group commit syncs the log every second). Every acknowledged shard must still be there.

The tests at the end place the cut at one exact interleaving of a group commit and a delete, in one process: real
threads, a group held at the start of its index write (a real store's `write`, the seam between computing the
chunk's watermark and writing it), and the cut made in a copy of the index, its log cut back to its size at the
last sync. The same cut then meets a put it tore (FAKE too: the pages such a put leaves, written behind the chunk's
back) whose payload holds a crafted shard record.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest

from blobstore_server.libs.chunkfile import (
    ChunkFile,
    ChunkId,
    GroupCommit,
    ShardNotFound,
    Vuid,
    commit,
    required_column_families,
)
from blobstore_server.libs.chunkfile.index import ShardIndex
from blobstore_server.libs.kv import Batch, KVStore
from tests.support.chunk_records import make_version_1, record, torn_put_holding, version_1_shard_header

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


class HeldStore(KVStore):
    """A real store that, once told, holds its next unsynced batch write (a group commit's index batch) at its
    start until released, and notes the size of its log after each sync: where a power cut cuts it back to."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, required_column_families())
        self.hold_next = False
        self.held = threading.Event()  # the held write is waiting
        self.release = threading.Event()
        self.synced = self.wal().stat().st_size

    def wal(self) -> Path:
        return sorted(self.path.glob("[0-9]*.log"))[-1]

    def write(self, batch: Batch, *, sync: bool = True) -> None:
        if not sync and self.hold_next:
            self.hold_next = False
            self.held.set()
            if not self.release.wait(30):
                raise TimeoutError("the held index write was never released")
        super().write(batch, sync=sync)
        if sync:
            self.synced = self.wal().stat().st_size

    def sync_wal(self) -> None:
        super().sync_wal()
        self.synced = self.wal().stat().st_size


def cut_power(kv: HeldStore, image: Path) -> Path:
    """FAKE power cut: a copy of the index as the disk holds it, its log cut back to its size at the last sync."""
    wal = kv.wal()
    assert wal.stat().st_size > kv.synced  # an index write is not synced yet: the cut loses it
    shutil.copytree(kv.path, image)
    os.truncate(image / wal.name, kv.synced)
    return image


def test_a_delete_racing_a_group_commit_loses_no_acknowledged_shard_in_a_power_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 62 item 1: bid 2's group has computed its chunk's watermark (past bid 2) and is about to write its
    unsynced index batch; a delete of bid 1, below it on the same chunk, writes its synced batch; then the power
    is cut (FAKE, `cut_power`) before anything syncs the group's batch. The delete's watermark must not cover bid 2,
    whose entry the cut may lose (it did: bid 2 read ShardNotFound)."""
    monkeypatch.setattr(commit, "WAL_SYNC_EVERY", 3600.0)  # the group commit's own log sync stays out of the window
    kv = HeldStore(tmp_path / "meta")
    cid = ChunkId.new(VUID)
    chunk = ChunkFile.create(tmp_path / "chunk", kv, cid, commits=GroupCommit(kv))
    try:
        chunk.put_shard(1, VUID, payload(1))
        with ThreadPoolExecutor(2) as pool:
            try:
                kv.hold_next = True
                putting = pool.submit(chunk.put_shard, 2, VUID, payload(2))
                assert kv.held.wait(10)  # bid 2's group has its watermark and waits to write its batch
                deleting = pool.submit(chunk.delete_shard, 1)
                wait([deleting], timeout=0.5)  # time for the delete's synced batch to go first, if it can
            finally:
                kv.release.set()
            putting.result(10)  # bid 2 acknowledged
            deleting.result(10)
        chunk.put_shard(3, VUID, payload(3))  # acknowledged after the last sync: the cut loses its entry
        with KVStore(cut_power(kv, tmp_path / "after-the-cut"), required_column_families()) as cut:
            assert ShardIndex(cut, cid).get(3) is None  # the cut happened
            again = ChunkFile.open(chunk.path, cut, cid)
            try:
                for bid in (2, 3):
                    assert again.read_shard(bid) == payload(bid), bid
                with pytest.raises(ShardNotFound):
                    again.read_shard(1)
            finally:
                again.close()
    finally:
        chunk.close()
        kv.close()


class FailingWrite(ChunkFile):
    """FAKE fault: once armed, the next shard write waits until told, then fails with EIO having written nothing
    (a disk failing one write while the others succeed cannot be produced for real here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.armed = False
        self.stalled = threading.Event()
        self.fail = threading.Event()

    def _write_at(self, offset: int, bufs: list[memoryview | bytes], phys: int, direct_fd: int | None) -> None:
        if not self.armed:
            return super()._write_at(offset, bufs, phys, direct_fd)
        self.armed = False
        self.stalled.set()
        self.fail.wait(30)
        raise OSError(errno.EIO, "injected: the shard write failed")


def test_a_deleted_shard_stays_deleted_when_a_watermark_computed_earlier_is_written_later(tmp_path: Path) -> None:
    """The index's watermark must never go down. Bid 10's write stalls; bid 11 lands past it (its group leaves the
    watermark at bid 10, still pending below); bid 12's group computes that same watermark and is held before
    writing its batch; bid 10's write fails, so nothing pends below bid 12 any more, and a delete of bid 11 moves the
    watermark past bid 11. Were the group's lower watermark written after the delete's, a power cut that keeps every
    index write but loses the hole punched for bid 11 would let open find bid 11 again. Two FAKE faults: the failed
    write (`FailingWrite`) and the lost punch (the chunk file put back as it was before the delete)."""
    kv = HeldStore(tmp_path / "meta")
    cid = ChunkId.new(VUID)
    chunk = FailingWrite.create(tmp_path / "chunk", kv, cid, commits=GroupCommit(kv))
    before_punch = tmp_path / "before-the-punch"
    try:
        chunk.put_shard(1, VUID, payload(1))
        with ThreadPoolExecutor(3) as pool:
            try:
                chunk.armed = True
                failing = pool.submit(chunk.put_shard, 10, VUID, payload(10))
                assert chunk.stalled.wait(10)
                chunk.put_shard(11, VUID, payload(11))
                kv.hold_next = True
                putting = pool.submit(chunk.put_shard, 12, VUID, payload(12))
                assert kv.held.wait(10)  # bid 12's group has its watermark and waits to write its batch
                chunk.fail.set()
                with pytest.raises(OSError, match="injected"):
                    failing.result(10)
                shutil.copyfile(chunk.path, before_punch)
                deleted = chunk.stat_shard(11)
                deleting = pool.submit(chunk.delete_shard, 11)
                wait([deleting], timeout=0.5)  # time for the delete's batch to go first, if it can
            finally:
                chunk.fail.set()
                kv.release.set()
            putting.result(10)
            deleting.result(10)
        kv.sync_wal()  # every index write durable (the group commit's log sync a second later does it)
        header = slice(deleted.offset, deleted.offset + 32)
        assert chunk.path.read_bytes()[header] == bytes(32)  # punched...
        assert before_punch.read_bytes()[header] != bytes(32)  # ... and FAKE power cut: the punch lost
        chunk.close()
        os.replace(before_punch, chunk.path)
        again = ChunkFile.open(chunk.path, kv, cid)
        try:
            for bid in (10, 11):
                with pytest.raises(ShardNotFound):
                    again.read_shard(bid)
            for bid in (1, 12):
                assert again.read_shard(bid) == payload(bid), bid
        finally:
            again.close()
    finally:
        chunk.close()
        kv.close()


def cut_and_reopen_with_a_torn_put(kv: HeldStore, chunk: ChunkFile, crafted: bytes, image: Path) -> ChunkFile:
    """Bid 1 acknowledged with its index entry synced, bid 2 acknowledged after the last sync; then a put of bid 3
    torn by a power cut holding `crafted` (`torn_put_holding`), and the cut (`cut_power`), which loses bid 2's entry.
    The chunk opened again on what the cut left."""
    chunk.put_shard(1, VUID, payload(1))
    kv.sync_wal()
    chunk.put_shard(2, VUID, payload(2))
    chunk.close()
    with open(chunk.path, "ab") as f:
        f.write(torn_put_holding(crafted, 3, VUID, chunk.tag))
    cut = KVStore(cut_power(kv, image), required_column_families())
    try:
        assert ShardIndex(cut, chunk.chunk_id).get(1) is not None
        assert ShardIndex(cut, chunk.chunk_id).get(2) is None  # the cut happened
        return ChunkFile.open(chunk.path, cut, chunk.chunk_id)
    except BaseException:
        cut.close()
        raise


@pytest.mark.parametrize("crafted_bid", [99, 2], ids=["a new bid", "an acknowledged shard's bid"])
def test_a_record_crafted_in_a_torn_put_is_not_indexed_after_a_power_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crafted_bid: int) -> None:
    """Issue 62 item 1: a user's blob holds a complete shard record naming this chunk's own unit (the vid is in the
    Location, the unit index a guess) at a 4 KiB boundary of a put that a power cut tears, and the same cut loses
    bid 2's index entry. On open, the scan past the watermark finds bid 2 again, and must not index the crafted
    record: neither as a new shard, nor as bid 2 (found later, it replaced the acknowledged one)."""
    monkeypatch.setattr(commit, "WAL_SYNC_EVERY", 3600.0)  # the group commit's own log sync stays out of the window
    kv = HeldStore(tmp_path / "meta")
    cid = ChunkId.new(VUID)
    chunk = ChunkFile.create(tmp_path / "chunk", kv, cid, commits=GroupCommit(kv))
    try:
        crafted = record(crafted_bid, VUID, b"forged" * 1000, 0)  # the tag unknown: the untagged layout
        again = cut_and_reopen_with_a_torn_put(kv, chunk, crafted, tmp_path / "after-the-cut")
        try:
            for bid in (1, 2):
                assert again.read_shard(bid) == payload(bid), bid
            assert [m.bid for m in again.list_shards()] == [1, 2]
            assert os.path.getsize(again.path) == again.stats().write_offset  # the torn put cut off
        finally:
            again.close()
            again.kv.close()
    finally:
        chunk.close()
        kv.close()


def test_a_version_1_chunk_finds_its_shards_again_after_a_power_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk made before the tag (format version 1) recovers as it did: its shards (untagged) past the watermark
    are indexed again, a record naming another unit inside a torn put is not; it stays version 1 and takes puts."""
    monkeypatch.setattr(commit, "WAL_SYNC_EVERY", 3600.0)
    kv = HeldStore(tmp_path / "meta")
    cid = ChunkId.new(VUID)
    ChunkFile.create(tmp_path / "chunk", kv, cid).close()
    make_version_1(tmp_path / "chunk")
    chunk = ChunkFile.open(tmp_path / "chunk", kv, cid, commits=GroupCommit(kv))
    try:
        assert chunk.tag == 0
        crafted = record(99, Vuid.make(3, 1, 1), b"forged" * 1000, 0)  # another unit of the volume
        again = cut_and_reopen_with_a_torn_put(kv, chunk, crafted, tmp_path / "after-the-cut")
        try:
            found = again.stat_shard(2)
            with open(again.path, "rb") as f:
                f.seek(found.offset)
                assert f.read(32) == version_1_shard_header(2, VUID, len(payload(2)))
            assert [m.bid for m in again.list_shards()] == [1, 2]
            again.put_shard(4, VUID, payload(4))
            for bid in (1, 2, 4):
                assert again.read_shard(bid) == payload(bid), bid
        finally:
            again.close()
            again.kv.close()
    finally:
        chunk.close()
        kv.close()
