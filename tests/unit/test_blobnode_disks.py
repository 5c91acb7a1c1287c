"""In-process checks of the blobnode's disk layer that need no HTTP."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import errors
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.disk import DiskFormatError, delete_wait, format_disk, read_format
from blobstore_server.services.blobnode.node import Blobnode


def make_node(tmp_path: Path, disks: int = 2) -> Blobnode:
    config = BlobnodeConfig(disks=[{"path": str(tmp_path / f"d{i}"), "disk_id": i + 1} for i in range(disks)])
    return Blobnode(config)


def test_a_stalled_disk_does_not_stall_the_others(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    release = threading.Event()
    try:
        async def scenario() -> None:
            vuid = Vuid.make(1, 0, 1)
            await node.create_chunk(2, vuid, None)
            loop = asyncio.get_running_loop()
            # Occupy every I/O thread of disk 1, as a hung device would.
            stuck = [loop.run_in_executor(node.disk(1).executor, release.wait)
                     for _ in range(node.config.io_threads_per_disk)]
            await asyncio.wait_for(node.put_shard(2, vuid, 1, bytearray(b"still served")), timeout=5)
            _, _, pieces = await node.open_shard_read(2, vuid, 1, 0, None)
            assert b"".join([p async for p in pieces]) == b"still served"
            release.set()
            await asyncio.gather(*stuck)

        asyncio.run(scenario())
    finally:
        release.set()
        node.close()


def test_background_threads_run_nice_levels_below_the_user_threads(tmp_path: Path) -> None:
    node = make_node(tmp_path, disks=1)
    try:
        disk = node.disks[1]

        def nice() -> int:
            return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

        user = disk.executor.submit(nice).result()
        assert user == os.getpriority(os.PRIO_PROCESS, 0)
        assert disk.background_executor.submit(nice).result() == min(19, user + node.config.background_nice)
        assert node.config.background_nice == 10
    finally:
        node.close()


def test_format_file_is_checked(tmp_path: Path) -> None:
    format_disk(tmp_path, disk_id=3, cluster_id=9)
    assert read_format(tmp_path).disk_id == 3
    path = tmp_path / ".sys" / "format.json"
    path.write_text(path.read_text().replace('"disk_id": 3', '"disk_id": 4'))
    with pytest.raises(DiskFormatError, match="checksum"):
        read_format(tmp_path)


def test_unformatted_disk_without_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DiskFormatError, match="no disk_id"):
        Blobnode(BlobnodeConfig(disks=[{"path": str(tmp_path / "d")}]))


def test_chunk_limit_per_disk(tmp_path: Path) -> None:
    node = Blobnode(BlobnodeConfig(disks=[{"path": str(tmp_path / "d"), "disk_id": 1, "max_chunks": 2}]))
    try:
        async def scenario() -> None:
            await node.create_chunk(1, Vuid.make(1, 0, 1), None)
            await node.create_chunk(1, Vuid.make(2, 0, 1), None)
            with pytest.raises(errors.NoSpace, match="maximum of 2 chunks"):
                await node.create_chunk(1, Vuid.make(3, 0, 1), None)

        asyncio.run(scenario())
    finally:
        node.close()


def test_a_marked_shard_is_deletable_only_its_hold_after_the_mark() -> None:
    # marked_at 1000 is a mark anywhere in [1000, 1001): the hold runs from 1001, never cut short
    assert delete_wait(marked_at=1000, hold=60, now=1000.9) == pytest.approx(60.1)
    assert delete_wait(marked_at=1000, hold=60, now=1060.5) == 0.5
    assert delete_wait(marked_at=1000, hold=60, now=1061) == 0
    assert delete_wait(marked_at=1000, hold=0, now=1000) == 0  # no hold: at once
    assert delete_wait(marked_at=1000, hold=60, now=900) == 161  # a clock stepped back waits on
    assert delete_wait(marked_at=0, hold=60, now=1000) == 0  # marked before marks were timed: no record to hold


def test_a_seal_during_a_compaction_is_kept_and_the_record_names_the_new_file(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk sealed read-only while a compaction copies it: the compaction commits the record it read at its start
    unless the seal waits for it; the seal must hold afterwards, and the record (also after a restart) must name the
    compacted file, not the old one now in the trash."""
    from blobstore_server.libs.chunkfile import ChunkFile
    from blobstore_server.libs.proto.blobnode import ChunkStatus

    copying, go_on = threading.Event(), threading.Event()
    compact_into = ChunkFile.compact_into

    def held_compaction(self: ChunkFile, *args: object, **kwargs: object) -> ChunkFile:
        copying.set()
        assert go_on.wait(10)
        return compact_into(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ChunkFile, "compact_into", held_compaction)
    vuid = Vuid.make(7, 0, 1)
    node = make_node(tmp_path, disks=1)
    disk = node.disk(1)
    try:
        disk.create_chunk(vuid, 1 << 20)
        disk.put_shard(vuid, 1, b"kept" * 100)
        compaction = threading.Thread(target=disk.compact_chunk, args=(vuid,))
        compaction.start()
        assert copying.wait(10)
        seal = threading.Thread(target=disk.set_chunk_status, args=(vuid, ChunkStatus.READONLY))
        seal.start()
        seal.join(0.3)
        go_on.set()
        compaction.join(10)
        seal.join(10)
        record = next(r for r in disk.list_chunks() if r.vuid == vuid)
        assert record.status is ChunkStatus.READONLY
    finally:
        go_on.set()
        node.close()
    node = make_node(tmp_path, disks=1)
    try:
        disk = node.disk(1)
        record = next(r for r in disk.list_chunks() if r.vuid == vuid)
        assert record.status is ChunkStatus.READONLY
        assert bytes(disk.read_chunk(vuid).read_shard(1)) == b"kept" * 100
    finally:
        node.close()
