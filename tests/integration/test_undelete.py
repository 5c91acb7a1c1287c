"""Undelete end to end: real clustermgr (its Raft-kept undelete records), Kafka, mqproxy, tinker, access, blobnodes;
the operator through the CLI, a user through the SDK with a grant."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from blobstore import Client, Forbidden, NotFound
from blobstore_server.cli.cli import app
from blobstore_server.libs.proto.blobnode import MARK_GRANULARITY
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import UNDELETE_MARGIN
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.proto.tinker import PipelineStats, TinkerStats
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.load import wait_for_put
from tests.support.processes import SIGNED, LocalCluster, wait_until
from tests.support.shards import blobs_of, states

ClusterFactory = Callable[..., LocalCluster]


def tinker_deletes(cluster: LocalCluster) -> PipelineStats:
    answer = httpx.get(f"{cluster.background['tinker'].url}/stats", timeout=30, auth=SIGNED)
    return TinkerStats.model_validate_json(answer.content).pipelines["delete"]


def grant(capability: str) -> str:
    """What the operator hands an SDK user: `blobstore auth grant CAPABILITY` ($BLOBSTORE_SECRET is the cluster's)."""
    printed = CliRunner().invoke(app, ["auth", "grant", capability, "--ttl", "600"])
    assert printed.exit_code == 0, printed.output
    return printed.stdout.strip()


def undelete_records(cluster: LocalCluster) -> dict[str, str]:
    async def listed() -> dict[str, str]:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm:
            return await cm.kv_list("undelete/")

    return asyncio.run(listed())


def process_state(pid: int) -> str:
    """The state letter /proc gives a process: T while it is stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_an_undelete_within_the_delay_brings_the_object_back_for_good(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=3.0)
    access = cluster.access[0].url
    data = random.Random(5).randbytes(300_000)
    with httpx.Client(base_url=access, timeout=60) as client:
        token = wait_for_put(client, data)
        (vid, bid), = blobs_of(cluster, token)
        deleted_at = time.monotonic()
        assert client.delete(f"/blob/{token}").status_code == 202
        wait_until(lambda: client.get(f"/blob/{token}").status_code == 404, 10, "tinker to mark it deleted")
        assert states(cluster, vid, bid) == ["mark_deleted"] * 6
        undone = CliRunner().invoke(app, ["blob", "undelete", token, "--access", access, "--json"])
        assert undone.exit_code == 0, undone.output
        undeleted_at = time.time()
        assert json.loads(undone.stdout) == {"blobs": 1, "unmarked": 6, "missing": 0, "unreachable": 0}
        assert client.get(f"/blob/{token}").content == data
        # Tinker comes to the purge once the safe delay has passed, finds the undelete and leaves the blob be.
        wait_until(lambda: tinker_deletes(cluster).done == 1, 20, "tinker to be done with the delete")
        assert time.monotonic() - deleted_at > 3.0
        assert states(cluster, vid, bid) == ["present"] * 6
        assert tinker_deletes(cluster).undeleted == 1
        assert client.get(f"/blob/{token}").content == data
        log = Path(cluster.background["tinker"].config["delete_log"])
        assert not log.exists() or f'"bid": {bid},' not in log.read_text()
        # A DELETE sent again later stands: the undelete took back only those before it.
        wait_until(lambda: time.time() > undeleted_at + UNDELETE_MARGIN, 10, "the undelete's clock margin")
        assert client.delete(f"/blob/{token}").status_code == 202
        wait_until(lambda: states(cluster, vid, bid) == ["missing"] * 6, 20, "the second delete purged")
        assert client.get(f"/blob/{token}").status_code == 404


def test_an_undelete_after_part_of_the_purge_restores_what_decodes_and_repairs_the_rest(
        cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=3.0)
    access = cluster.access[0].url
    data = random.Random(7).randbytes(200_000)
    with httpx.Client(base_url=access, timeout=60) as client, Client([access], grant=grant("undelete")) as sdk:
        token = wait_for_put(client, data)
        (vid, bid), = blobs_of(cluster, token)
        assert client.delete(f"/blob/{token}").status_code == 202
        wait_until(lambda: states(cluster, vid, bid) == ["mark_deleted"] * 6, 10, "tinker to mark it deleted")
        # The blobnodes of the three data shards go away: tinker's purge removes the parity and fails on them.
        hosts = {unit.host for unit in unit_hosts(cluster, vid)[:3]}
        away = [node for node in cluster.blobnodes if node.url in hosts]
        assert len(away) == 3
        for node in away:
            node.kill9()
        wait_until(lambda: states(cluster, vid, bid) == ["unreachable"] * 3 + ["missing"] * 3, 20, "a partial purge")
        for node in away:
            node.spawn()
        for node in away:
            node.ready(30.0)
        # Tinker retries the purge after its back-off and the safe delay again: the undelete lands first.
        assert sdk.undelete(token).model_dump() == {"blobs": 1, "unmarked": 3, "missing": 3, "unreachable": 0}
        assert client.get(f"/blob/{token}").content == data  # from the three data shards
        wait_until(lambda: states(cluster, vid, bid) == ["present"] * 6, 60, "the purged shards repaired")
        wait_until(lambda: tinker_deletes(cluster).undeleted == 1, 30, "tinker's retry to take the delete back")
        assert states(cluster, vid, bid) == ["present"] * 6
        assert client.get(f"/blob/{token}").content == data


def unit_hosts(cluster: LocalCluster, vid: int) -> list[Unit]:
    async def units() -> list[Unit]:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm:
            return (await cm.get_volume(vid)).units

    return asyncio.run(units())


def test_an_undelete_after_the_purge_answers_not_found_saying_why(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=1.0)
    access = cluster.access[0].url
    with httpx.Client(base_url=access, timeout=60) as client:
        token = wait_for_put(client, b"gone for good" * 1000)
        (vid, bid), = blobs_of(cluster, token)
        assert client.delete(f"/blob/{token}").status_code == 202
        wait_until(lambda: states(cluster, vid, bid) == ["missing"] * 6, 20, "every shard purged")
        with Client([access], grant=grant("undelete")) as sdk, pytest.raises(NotFound) as gone:
            sdk.undelete(token)
        assert gone.value.code == "purged", gone.value
        assert "keeps 0 of the 3 shards it needs" in gone.value.message and "safe delay (1 s)" in gone.value.message
        failed = CliRunner().invoke(app, ["blob", "undelete", token, "--access", access])
        assert failed.exit_code == 1 and "404 purged" in failed.stderr, failed.output
        assert client.get(f"/blob/{token}").status_code == 404


def test_an_undelete_before_a_stopped_tinker_marked_holds_once_it_resumes(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=2.0)
    tinker = cluster.background["tinker"]
    access = cluster.access[0].url
    data = random.Random(6).randbytes(100_000)
    with httpx.Client(base_url=access, timeout=60) as client, Client([access], grant=grant("undelete")) as sdk:
        token = wait_for_put(client, data)
        (vid, bid), = blobs_of(cluster, token)
        os.kill(tinker.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: process_state(tinker.pid) == "T", 5, "tinker stopped")  # it reads nothing now
            deleted_at = time.time()
            assert client.delete(f"/blob/{token}").status_code == 202  # the delete is in Kafka, not yet marked
            assert states(cluster, vid, bid) == ["present"] * 6
            # Nothing to unmark: only the record in clustermgr stands between the queued delete and the purge.
            assert sdk.undelete(token).model_dump() == {"blobs": 1, "unmarked": 0, "missing": 0, "unreachable": 0}
        finally:
            os.kill(tinker.pid, signal.SIGCONT)
        wait_until(lambda: process_state(tinker.pid) != "T", 5, "tinker resumed")
        wait_until(lambda: tinker_deletes(cluster).done == 1, 30, "tinker to be done with the delete")
        wait_until(lambda: time.time() > deleted_at + 2.0 + MARK_GRANULARITY, 10, "the safe delay to pass")
        assert states(cluster, vid, bid) == ["present"] * 6
        assert client.get(f"/blob/{token}").content == data
        assert tinker_deletes(cluster).undeleted == 1  # taken back before it marked anything


def test_forged_locations_and_callers_without_the_capability_change_nothing(shared_cluster: LocalCluster) -> None:
    access = shared_cluster.access[0].url
    with httpx.Client(base_url=access, timeout=60) as client:
        token = wait_for_put(client, b"keep me as I am")
    real = Location.from_token(token, shared_cluster.secret.encode())
    forged = Location(real.cluster_id, real.code_mode, real.size, real.blob_size, real.crc,
                      real.blobs).to_token(b"not the cluster's secret")
    middle = len(token) // 2
    altered = token[:middle] + ("B" if token[middle] == "A" else "A") + token[middle + 1:]
    undelete = grant("undelete")
    with Client([access], grant=undelete) as sdk:
        for bad in (forged, altered):
            with pytest.raises(Forbidden) as refused:
                sdk.undelete(bad)
            assert refused.value.status == 403 and "signature does not match" in refused.value.message
    with Client([access]) as unsigned, pytest.raises(Forbidden) as refused:
        unsigned.undelete(token)
    assert refused.value.status == 401, refused.value
    with Client([access], grant=grant("read-shard")) as reader, pytest.raises(Forbidden) as refused:
        reader.undelete(token)
    assert refused.value.status == 403 and "takes the undelete capability" in refused.value.message
    assert undelete_records(shared_cluster) == {}  # no refused request left a record behind
    with Client([access], grant=undelete) as sdk:  # an object never deleted: nothing to undo, nothing changes
        assert sdk.undelete(token).model_dump() == {"blobs": 1, "unmarked": 0, "missing": 0, "unreachable": 0}
        assert sdk.get(token) == b"keep me as I am"
