"""Snapshot files: the state machine's own snapshot directory (e.g. a RocksDB checkpoint) packed
into one tar with the Raft metadata, so that it streams as one byte range and resumes at an offset.

Layout under `<data_dir>/snap/`: `<index>-<term>.tar` complete snapshots (written to a temp
name, fsync'd, renamed), `recv-<index>-<term>.part` a snapshot being received.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

from blobstore_server.libs.raft.messages import SnapshotMeta, decode_members, encode_members

META_NAME = "raft_meta.json"
STATE_DIR = "state"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path_for(self, index: int, term: int) -> Path:
        return self.root / f"{index:020d}-{term}.tar"

    def latest(self) -> tuple[SnapshotMeta, Path] | None:
        done = sorted(self.root.glob("*.tar"))
        return (read_meta(done[-1]), done[-1]) if done else None

    def work_dir(self, name: str) -> Path:
        """An empty scratch directory (for the state machine to write a snapshot into)."""
        path = self.root / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def pack(self, work: Path, meta: SnapshotMeta) -> Path:
        """Pack `work/state` with `meta` into a complete snapshot file (blocking: run in a thread)."""
        (work / META_NAME).write_text(json.dumps(
            {"index": meta.index, "term": meta.term, "members": encode_members(meta.members).decode()}))
        tmp = self.root / f"tmp-{meta.index}.tar"
        with tarfile.open(tmp, "w") as tar:
            tar.add(work / META_NAME, META_NAME)
            tar.add(work / STATE_DIR, STATE_DIR)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        final = self.path_for(meta.index, meta.term)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        shutil.rmtree(work, ignore_errors=True)
        return final

    def unpack(self, path: Path) -> Path:
        """Extract a snapshot; returns the state machine's directory inside it."""
        dest = self.work_dir("restore")
        with tarfile.open(path) as tar:
            tar.extractall(dest, filter="data")
        return dest / STATE_DIR

    def prune(self, keep: Path) -> None:
        """Drop every snapshot and partial transfer but `keep` (open readers keep their copy)."""
        for p in self.root.iterdir():
            if p != keep and p.is_file() and p.suffix in (".tar", ".part"):
                p.unlink(missing_ok=True)


def read_meta(path: Path) -> SnapshotMeta:
    with tarfile.open(path) as tar:
        member = tar.extractfile(META_NAME)
        assert member is not None
        raw = json.loads(member.read())
    return SnapshotMeta(raw["index"], raw["term"], decode_members(raw["members"].encode()))


class Receiver:
    """A snapshot arriving in chunks; survives a broken stream (and a restart) to resume."""

    def __init__(self, store: SnapshotStore, index: int, term: int) -> None:
        self.store, self.index, self.term = store, index, term
        self.path = store.root / f"recv-{index}-{term}.part"
        self.size = self.path.stat().st_size if self.path.exists() else 0

    def write(self, offset: int, data: bytes) -> None:
        if offset != self.size:
            return  # out of order: the sender resumes from `size`
        with open(self.path, "ab") as f:
            f.write(data)
        self.size += len(data)

    def finish(self) -> Path:
        with open(self.path, "rb+") as f:
            os.fsync(f.fileno())
        final = self.store.path_for(self.index, self.term)
        os.replace(self.path, final)
        _fsync_dir(self.store.root)
        return final
