"""Signed internal requests against a whole cluster started by the launcher (which turns signing on):
unsigned, badly signed, replayed and under-privileged calls to every mutating route are refused and
change nothing; the CLI and the services keep working; a rotation with an overlap loses no request."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from blobstore import Client
from blobstore.cli import app
from blobstore.launcher import SECRET_FILE, ClusterInfo, down, up
from blobstore.plan import ClusterShape
from libs.proto.cluster import DiskStatus
from libs.proto.ids import Vuid
from libs.rpc import auth
from libs.rpc.auth import AUTH_HEADER, AuthConfig, Role, Signer, new_secret
from services.blobnode.client import BlobnodeClient
from services.clustermgr.client import ClusterClient
from tests.support.processes import BlobnodeFactory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    root = tmp_path_factory.mktemp("signed")
    try:
        yield up(root, ClusterShape(blobnodes=6, disks_per_node=1, delete_delay=1.0), timeout=60)
    finally:
        if (root / "cluster.json").exists():
            down(root)


def urls(cluster: ClusterInfo, role: str) -> list[str]:
    return [p.url for p in cluster.processes if p.role == role]


def test_keys_are_private_and_the_public_api_and_cli_work(cluster: ClusterInfo) -> None:
    root = Path(cluster.dir)
    assert (root / SECRET_FILE).stat().st_mode & 0o777 == 0o600
    assert all(Path(p.config).stat().st_mode & 0o777 == 0o600 for p in cluster.processes if p.role != "kafka")
    with Client(cluster.access_url) as client:  # unsigned: the Location is the capability
        assert client.get(client.put(b"signed cluster")) == b"signed cluster"
    result = CliRunner().invoke(app, ["config", "set", "switch/balance", "on", "--dir", cluster.dir])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["disk", "list", "--json", "--dir", cluster.dir])
    assert result.exit_code == 0 and '"status": "normal"' in result.output


def test_unsigned_bad_and_replayed_calls_to_every_mutating_route_are_401_and_change_nothing(
        cluster: ClusterInfo) -> None:
    async def scenario() -> None:
        async with ClusterClient(cluster.clustermgr_urls) as cm, BlobnodeClient() as bn:
            disk = (await cm.list_disks())[0]
            volume = (await cm.list_volumes())[0]
            unit = volume.units[0]
            with Client(cluster.access_url) as client:
                client.put(os.urandom(5000))
            shards = await bn.list_shards(unit.host, unit.disk_id, unit.vuid)
            bid = shards[0].bid if shards else 1
            calls: list[tuple[str, str, dict[str, object]]] = [
                (unit.host, "/shard/delete", {"disk_id": unit.disk_id, "vuid": unit.vuid, "bid": bid}),
                (unit.host, "/chunk/create", {"disk_id": disk.disk_id, "vuid": unit.vuid + 99}),
                (unit.host, "/chunk/release", {"disk_id": unit.disk_id, "vuid": unit.vuid}),
                (cluster.clustermgr_urls[0], "/disk/set", {"disk_id": disk.disk_id, "status": "broken"}),
                (cluster.clustermgr_urls[0], "/config/set", {"key": "switch/balance", "value": "off"}),
                (cluster.clustermgr_urls[0], "/kv/set", {"key": "intruder", "value": "x"}),
                (cluster.clustermgr_urls[0], "/raft/member/remove", {"node_id": 2}),
                (cluster.clustermgr_urls[0], "/volume/lock", {"vid": volume.vid}),
                (urls(cluster, "allocator")[0], "/volume/alloc", {"code_mode": "EC3P3", "size": 10}),
                (urls(cluster, "mqproxy")[0], "/repairmsg", {"messages": [{"vid": 1, "bid": 1, "bad_indexes": [0]}]}),
                (urls(cluster, "worker")[0], "/shard/repair", {"vid": volume.vid, "bid": bid, "bad_indexes": [0]}),
                (urls(cluster, "scheduler")[0], "/task/migrate", {"vid": volume.vid, "index": 0}),
            ]
            stranger = Signer(AuthConfig.for_roles(new_secret(), Role).keys)
            stale = Signer(AuthConfig.for_roles((Path(cluster.dir) / SECRET_FILE).read_text(), Role).keys,
                           clock=lambda: time.time() - 120)
            async with httpx.AsyncClient(timeout=10) as raw:
                for host, path, body in calls:
                    for signer in (None, stranger, stale):
                        headers = {}
                        if signer is not None:
                            headers[AUTH_HEADER] = signer.header("POST", f"{host}{path}", None,
                                                                 httpx.Request("POST", "/", json=body).read())
                        answer = await raw.post(f"{host}{path}", json=body, headers=headers)
                        assert answer.status_code == 401, (path, signer, answer.text)
                        assert answer.json()["code"] == "unauthorized"
            # nothing changed
            assert (await cm.get_disk(disk.disk_id)).status is DiskStatus.NORMAL
            assert (await cm.get_config("switch/balance")) != "off"
            assert await cm.kv_get("intruder") is None
            assert len((await cm.raft_status()).members) == 3
            assert (await cm.get_volume(volume.vid)).status.value != "lock"
            if shards:
                assert (await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)).status == "normal"
            assert len(await bn.list_chunks(unit.host, unit.disk_id)) >= 1

    asyncio.run(scenario())


def test_a_caller_below_the_routes_role_is_403(cluster: ClusterInfo) -> None:
    secret = (Path(cluster.dir) / SECRET_FILE).read_text()
    service = Signer(AuthConfig.for_roles(secret, [Role.DATA, Role.CONTROL]).keys)

    async def scenario() -> None:
        async with ClusterClient(cluster.clustermgr_urls) as cm:
            disk = (await cm.list_disks())[0]
        body = {"disk_id": disk.disk_id, "status": "broken"}
        url = f"{cluster.clustermgr_urls[0]}/disk/set"
        async with httpx.AsyncClient(timeout=10) as raw:
            header = service.header("POST", url, None, httpx.Request("POST", "/", json=body).read())
            answer = await raw.post(url, json=body, headers={AUTH_HEADER: header})
        assert answer.status_code in (403, 503), answer.text  # a follower may answer before the leader would
        if answer.status_code == 403:
            assert answer.json()["code"] == "forbidden"
        async with ClusterClient(cluster.clustermgr_urls) as cm:
            assert (await cm.get_disk(disk.disk_id)).status is DiskStatus.NORMAL

    asyncio.run(scenario())


def test_rotation_with_an_overlap_loses_no_request(blobnode_factory: BlobnodeFactory) -> None:
    old, new = new_secret(), new_secret()
    roles = [Role.DATA, Role.CONTROL]
    node = blobnode_factory("rotating", disks=1, auth=AuthConfig.for_roles(new, roles, old).model_dump(mode="json"))
    before = auth.installed()

    async def burst(secret: str) -> int:
        auth.install(Signer(AuthConfig.for_roles(secret, roles).keys))
        async with BlobnodeClient() as bn:
            await bn.create_chunk(node.url, 1, Vuid.make(1 if secret == old else 2, 0, 1))
            results = await asyncio.gather(*(bn.disk_stat(node.url, 1) for _ in range(50)), return_exceptions=True)
        return sum(not isinstance(r, Exception) for r in results)

    try:
        assert asyncio.run(burst(old)) == 50  # clients not yet given the new secret
        assert asyncio.run(burst(new)) == 50
    finally:
        auth.install(before)
