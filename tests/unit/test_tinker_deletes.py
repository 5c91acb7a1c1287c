"""Tinker's delete handler against an undelete that lands between its steps: before it marks, while it marks, and
between its last look and its purge. The interleavings are set up over a FAKE clustermgr and FAKE blobnodes (the
fake transport, libs.rpc.testing): one volume, the blob's shard status on each unit as a blobnode keeps it, and the
undelete record; the integration tests (tests/integration/test_undelete.py) run the same steps on real processes,
where these exact moments cannot be chosen."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from blobstore_server.libs.proto.blobnode import ShardStatusResult
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import Undeleted, VolumeView
from blobstore_server.libs.proto.messages import DeleteMsg
from blobstore_server.libs.rpc import errors
from blobstore_server.libs.rpc.client import HttpClient, Request
from blobstore_server.libs.rpc.testing import FakeReply, FakeTransport
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.tinker.handlers import DeleteHandler

VID, BID = 5, 42
UNITS = [Unit(vuid=100 + i, disk_id=1 + i, host=f"http://bn{i}") for i in range(3)]
MSG = DeleteMsg(vid=VID, bid=BID, time=1000.0)
STATUS_OP = {"/shard/markdelete": "mark_deleted", "/shard/unmarkdelete": "normal", "/shard/delete": None}


class Cluster:
    """The FAKE clustermgr and blobnodes: `shards` maps a unit's vuid to its shard's status (absent: gone);
    `before[path]` runs once, as the first request to `path` arrives (an undelete landing at that moment)."""

    def __init__(self) -> None:
        self.shards: dict[int, str] = {u.vuid: "normal" for u in UNITS}
        self.undeleted_at: float | None = None
        self.before: dict[str, Callable[[], None]] = {}

    def undelete(self, at: float = MSG.time + 1) -> None:
        """What access does: the record first, then every mark lifted."""
        self.undeleted_at = at
        self.shards = {vuid: "normal" for vuid in self.shards}

    async def handle(self, request: Request) -> FakeReply:
        path = urlsplit(request.url).path
        if (landing := self.before.pop(path, None)) is not None:
            landing()
        if path == "/volume/get":
            return FakeReply.of(VolumeView(vid=VID, code_mode=1, backend="isal", units=UNITS, capacity=1))
        if path == "/undelete/get":
            asked = parse_qs(urlsplit(request.url).query)["bids"][0].split(".")
            return FakeReply.of(Undeleted(at=[self.undeleted_at] * len(asked)))
        vuid = json.loads(bytes(request.body or b"{}"))["vuid"]
        if vuid not in self.shards:
            return FakeReply.of(errors.ShardNotFound("no such shard"))
        status = STATUS_OP[path]
        if status is None and self.shards[vuid] != "mark_deleted":
            return FakeReply.of(errors.Conflict("not marked deleted: mark it first"))  # what a blobnode answers
        if status is None:
            del self.shards[vuid]
        else:
            self.shards[vuid] = status
        return FakeReply.of(ShardStatusResult(bid=BID, status=status or "deleted"))


def handler(cluster: Cluster, log: Path) -> DeleteHandler:
    http = HttpClient(FakeTransport(cluster.handle))
    return DeleteHandler(ClusterClient(["http://cm"], http=http), BlobnodeClient(http), log)


def test_a_delete_undeleted_before_tinker_reaches_it_is_never_marked(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.undelete()
    assert asyncio.run(handler(cluster, tmp_path / "log").mark(MSG)) == []
    assert set(cluster.shards.values()) == {"normal"}


def test_an_undelete_landing_while_tinker_marks_has_the_marks_lifted_at_once(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.before["/shard/markdelete"] = cluster.undelete  # its unmarks come first; tinker's marks land after
    assert asyncio.run(handler(cluster, tmp_path / "log").mark(MSG)) == []
    assert set(cluster.shards.values()) == {"normal"}


def test_a_purge_refused_by_an_undelete_after_the_last_look_leaves_the_blob(tmp_path: Path) -> None:
    cluster = Cluster()
    deletes = handler(cluster, tmp_path / "log")
    assert asyncio.run(deletes.mark(MSG)) == [(VID, BID)]
    assert set(cluster.shards.values()) == {"mark_deleted"}
    cluster.before["/shard/delete"] = cluster.undelete
    assert asyncio.run(deletes.purge(MSG, [(VID, BID)])) == []
    assert set(cluster.shards.values()) == {"normal"} and len(cluster.shards) == 3
    assert not (tmp_path / "log").exists()  # not logged as purged


def test_a_purge_refused_without_an_undelete_fails_and_is_retried(tmp_path: Path) -> None:
    """A mark lifted by hand (no record) is no undelete: the refusal stands, and the retry marks it again."""
    cluster = Cluster()
    deletes = handler(cluster, tmp_path / "log")
    asyncio.run(deletes.mark(MSG))
    cluster.shards[UNITS[0].vuid] = "normal"
    with pytest.raises(errors.Conflict):
        asyncio.run(deletes.purge(MSG, [(VID, BID)]))


def test_a_later_delete_stands_and_is_purged(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.undeleted_at = MSG.time - 60  # an undelete of an earlier delete of the same blob
    deletes = handler(cluster, tmp_path / "log")
    assert asyncio.run(deletes.mark(MSG)) == [(VID, BID)]
    assert asyncio.run(deletes.purge(MSG, [(VID, BID)])) == [(VID, BID)]
    assert cluster.shards == {}
    assert json.loads((tmp_path / "log").read_text())["bid"] == BID
