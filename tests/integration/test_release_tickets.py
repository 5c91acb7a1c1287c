"""Releasing a chunk takes clustermgr's release ticket (issue 65 item 1), on real processes: a leaked blobnode
config, the scheduler's keys or clustermgr's HMAC `chunk` key sign a release as before, and the blobnode refuses
it (403, the chunk untouched); clustermgr answers a ticket only for a unit dead for good; a migration still
releases its source, as does clustermgr's roll back of a half-created volume (test_clustermgr)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

import httpx
import pytest

from blobstore import AsyncClient
from blobstore_server.cluster.service_auth import role_auth
from blobstore_server.libs.proto.blobnode import ChunkStatus
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.proto.scheduler import ManualMigrate
from blobstore_server.libs.proto.switches import OFF, TaskType, switch_key
from blobstore_server.libs.rpc import errors, tickets
from blobstore_server.libs.rpc.auth import Signer
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.scheduler.client import SchedulerClient
from tests.support.processes import TEST_SECRET, BlobnodeFactory, LocalCluster, Service
from tests.support.tickets import hmac_keys, minter, post_signed, ticket_refused
from tests.support.waiting import eventually

VUID = Vuid.make(7, 2, 1)
WORKER = {"task_poll": 0.5, "task_runners": 2, "migrate_report_interval": 0.5}


def release(signer: Signer, host: str, disk_id: int, vuid: int, ticket: str | None = None) -> httpx.Response:
    """POST /chunk/release signed by `signer` for the `chunk` capability, as any holder of that key can."""
    return post_signed(signer, f"{host}/chunk/release", {"disk_id": disk_id, "vuid": vuid, "ticket": ticket})


def test_a_blobnode_releases_a_chunk_only_with_clustermgrs_ticket_for_it(blobnode_factory: BlobnodeFactory) -> None:
    node = blobnode_factory("target", disks=2)
    neighbour = role_auth(TEST_SECRET, "blobnode", {"bind_addr": "127.0.0.1:1"})  # another blobnode's conf.json
    holders = {role: hmac_keys(role_auth(TEST_SECRET, role, {"bind_addr": "127.0.0.1:2"}))
               for role in ("scheduler", "clustermgr")}
    holders["blobnode"] = hmac_keys(neighbour)
    releases = minter(TEST_SECRET, Kind.RELEASE)
    expired = minter(TEST_SECRET, Kind.RELEASE, ttl=-10)
    wrong = {"no ticket": (None, "takes a release ticket"),
             "another vuid": (releases.mint(node.url, 1, VUID + 1), "not clustermgr's"),
             "another disk": (releases.mint(node.url, 2, VUID), "not clustermgr's"),
             "another blobnode": (releases.mint("http://127.0.0.1:1", 1, VUID), "not clustermgr's"),
             "expired": (expired.mint(node.url, 1, VUID), "expired"),
             "another key": (minter("ab" * 32, Kind.RELEASE).mint(node.url, 1, VUID), "not clustermgr's"),
             "malformed": ("v1.soon.x", "malformed")}

    async def scenario() -> None:
        async with BlobnodeClient() as bn:
            await bn.create_chunk(node.url, 1, VUID)
            await bn.put_shard(node.url, 1, VUID, 1, b"live bytes")
            for role, signer in holders.items():
                for name, (ticket, reason) in wrong.items():
                    answer = await asyncio.to_thread(release, signer, node.url, 1, VUID, ticket)
                    assert ticket_refused(answer, reason), (role, name, answer.text)
            assert (await bn.chunk_stat(node.url, 1, VUID)).status is ChunkStatus.NORMAL
            assert await bn.get_shard(node.url, 1, VUID, 1) == b"live bytes"
            # clustermgr's ticket for this very chunk: released, whoever of the chunk key's holders carries it
            answer = await asyncio.to_thread(release, holders["scheduler"], node.url, 1, VUID,
                                             releases.mint(node.url, 1, VUID))
            assert answer.status_code == 200, answer.text
            with pytest.raises(errors.ChunkNotFound):
                await bn.get_shard(node.url, 1, VUID, 1)

    asyncio.run(scenario())


def test_a_blobnode_with_auth_but_no_ticket_key_releases_nothing(blobnode_factory: BlobnodeFactory) -> None:
    auth = {k: v for k, v in role_auth(TEST_SECRET, "blobnode", {"bind_addr": "127.0.0.1:1"}).items()
            if k != "ticket_public_keys"}
    node = blobnode_factory("keyless", disks=1, auth=auth)

    async def scenario() -> None:
        async with BlobnodeClient() as bn:
            await bn.create_chunk(node.url, 1, VUID)
            with pytest.raises(errors.TicketRefused, match="no release ticket key"):
                await bn.release_chunk(node.url, 1, VUID,
                                       ticket=minter(TEST_SECRET, Kind.RELEASE).mint(node.url, 1, VUID))
            assert (await bn.chunk_stat(node.url, 1, VUID)).status is ChunkStatus.NORMAL

    asyncio.run(scenario())


@pytest.mark.insecure
def test_a_blobnode_without_auth_releases_without_a_ticket(blobnode_factory: BlobnodeFactory) -> None:
    """`insecure: true` opens every route, this one too (clustermgr without auth mints no ticket)."""
    node = blobnode_factory("open", disks=1)

    async def scenario() -> None:
        async with BlobnodeClient() as bn:
            await bn.create_chunk(node.url, 1, VUID)
            await bn.release_chunk(node.url, 1, VUID)
            assert await bn.list_chunks(node.url, 1) == []

    asyncio.run(scenario())


def _service(cluster: LocalCluster, prefix: str) -> Service:
    return next(s for name, s in cluster.background.items() if name.startswith(prefix))


def test_only_a_dead_unit_gets_a_ticket_and_a_migration_still_releases_its_source(cluster_factory: Any) -> None:
    cluster = cluster_factory(blobnodes=7, min_volumes=1, schedulers=1, worker=WORKER)
    urls = [cm.url for cm in cluster.clustermgr]
    leaked = {"a blobnode's": cluster.blobnodes[-1].config["auth"],
              "the scheduler's": _service(cluster, "scheduler").config["auth"],
              "clustermgr's": cluster.clustermgr[0].config["auth"]}
    release_key = tickets.signing_key(TEST_SECRET, Kind.RELEASE)
    assert [name for name, auth in leaked.items() if auth.get("ticket_signing_key") == release_key] == ["clustermgr's"]

    async def scenario() -> None:
        data = os.urandom(50_000)
        async with AsyncClient([cluster.access[0].url], timeout=60) as client:
            location = await client.put(data)
        blobs = list(Location.from_token(location, cluster.secret.encode()).blob_ids())
        vid = Counter(v for v, _ in blobs).most_common(1)[0][0]
        async with ClusterClient(urls) as cm, BlobnodeClient() as bn, SchedulerClient(cm) as scheduler:
            await cm.set_config(switch_key(TaskType.BALANCE), OFF)
            volume = await cm.get_volume(vid)
            live = volume.units[0]
            # clustermgr gives no ticket for a live unit, nor for an epoch it has not issued yet
            with pytest.raises(errors.Conflict, match="live"):
                await cm.release_unit(vid, live.vuid, live.disk_id)
            unissued = Vuid.make(vid, 0, Vuid(live.vuid).epoch() + 5)
            with pytest.raises(errors.Conflict, match="never issued"):
                await cm.release_unit(vid, unissued, live.disk_id)
            # whoever holds the chunk key, a live chunk on another blobnode stays
            for name, auth in leaked.items():
                answer = await asyncio.to_thread(release, hmac_keys(auth), live.host, live.disk_id, live.vuid)
                assert ticket_refused(answer, "takes a release ticket"), (name, answer.text)
            assert (await bn.chunk_stat(live.host, live.disk_id, live.vuid)).status is ChunkStatus.NORMAL
            async with AsyncClient([cluster.access[0].url], timeout=60) as client:
                assert await client.get(location) == data
            # the scheduler's own path: a migration moves unit 0 and releases its source with clustermgr's ticket
            task = await scheduler.manual_migrate(ManualMigrate(vid=vid, index=0))

            async def source_released() -> bool:
                moved = (await cm.get_volume(vid)).units[0].vuid != live.vuid
                return moved and live.vuid not in {c.vuid for c in await bn.list_chunks(live.host, live.disk_id)}

            await eventually(source_released, 60, f"the migration of {task.task_id} releasing its source")
        async with AsyncClient([cluster.access[0].url], timeout=60) as client:
            assert await client.get(location) == data

    asyncio.run(scenario())
