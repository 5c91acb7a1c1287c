"""Signed internal requests against a whole cluster started by the launcher (which turns signing on):
unsigned, badly signed, replayed and under-privileged calls to every mutating route are refused and
change nothing; the CLI and the services keep working; a rotation with an overlap loses no request."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import ssl
import time
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from typer.testing import CliRunner

from blobstore import Client, NotFound
from blobstore.records import READ_PLAN_TYPE, ReadPlan
from blobstore_server.cli.cli import app
from blobstore_server.cluster.kafka_auth import kafka_user
from blobstore_server.cluster.launcher import SECRET_FILE, ClusterInfo, cluster_ca, restart
from blobstore_server.cluster.redis_auth import redis_password, with_credentials
from blobstore_server.libs.mq.admin import positions
from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.seal import message_key
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.mq.topics import Topic
from blobstore_server.libs.proto.cluster import DiskStatus, VolumeInfo
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.messages import DeleteMsg
from blobstore_server.libs.proto.routes import CATALOG
from blobstore_server.libs.proto.scheduler import LEADER_KEY, LeaderRecord
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import (
    AUTH_HEADER,
    AuthConfig,
    Signer,
    body_digest,
    capability_key,
    new_secret,
    sign,
)
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.launched import SMALL
from tests.support.metrics import sample
from tests.support.processes import BlobnodeFactory, wait_until
from tests.support.tickets import as_tinker

LAUNCH = SMALL  # the launched `cluster` (tests/conftest.py)


def redis_client(cluster: ClusterInfo, url: str, **options: Any) -> redis.Redis:
    """A client of the cluster's Redis at `url`, trusting the cluster CA when Redis takes TLS (several hosts)."""
    ca = cluster_ca(Path(cluster.dir))
    return redis.Redis.from_url(url, **options, **({"ssl_ca_certs": ca} if ca else {}))


def urls(cluster: ClusterInfo, role: str) -> list[str]:
    return [p.url for p in cluster.processes if p.role == role]


def test_keys_are_private_and_the_public_api_and_cli_work(cluster: ClusterInfo) -> None:
    root = Path(cluster.dir)
    assert (root / SECRET_FILE).stat().st_mode & 0o777 == 0o600
    assert all(Path(p.config).stat().st_mode & 0o777 == 0o600 for p in cluster.processes if p.role != "kafka")
    with Client(cluster.access_urls, ca=cluster.ca) as client:  # unsigned: the Location is the capability
        assert client.get(client.put(b"signed cluster")) == b"signed cluster"
    result = CliRunner().invoke(app, ["config", "set", "switch/balance", "on", "--dir", cluster.dir])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["disk", "list", "--json", "--dir", cluster.dir])
    assert result.exit_code == 0 and '"status": "normal"' in result.output


def test_a_read_plan_allows_its_own_shard_reads_once_and_nothing_else(cluster: ClusterInfo) -> None:
    data = os.urandom(5 << 20)
    with Client(cluster.access_urls, ca=cluster.ca) as client:
        location = client.put(data)
    answer = httpx.get(f"{cluster.access_url}/blob/{location}", headers={"accept": READ_PLAN_TYPE},
                       verify=cluster.verify)
    assert answer.status_code == 200 and answer.headers["content-type"] == READ_PLAN_TYPE
    plan = ReadPlan.model_validate_json(answer.content)
    assert plan.size == len(data) and all(AUTH_HEADER in piece.headers for piece in plan.pieces)
    first, second, third = plan.pieces[:3]
    assert httpx.get(first.url, headers=first.headers, verify=cluster.verify).content == data[:first.size]
    refused = [
        httpx.get(first.url, headers=first.headers, verify=cluster.verify),  # again: its nonce was used
        httpx.get(second.url.replace(f"size={second.size}", f"size={second.size + 1}"), headers=second.headers,
                  verify=cluster.verify),
        httpx.get(second.url.replace("/shard/get", "/shard/stat"), headers=second.headers, verify=cluster.verify),
        httpx.post(f"{urlsplit(second.url).scheme}://{urlsplit(second.url).netloc}/shard/delete",
                   headers=second.headers, json={}, verify=cluster.verify),
        httpx.get(third.url, verify=cluster.verify),  # unsigned
    ]
    assert [r.status_code for r in refused] == [401] * len(refused), [r.text for r in refused]
    second_bytes = httpx.get(second.url, headers=second.headers, verify=cluster.verify).content
    assert second_bytes == data[first.size:first.size + second.size]
    # Below `direct_reads_from` (4 MiB) the bytes come as ever.
    small = httpx.get(f"{cluster.access_url}/blob/{location}",
                      headers={"accept": READ_PLAN_TYPE, "range": "bytes=0-99"}, verify=cluster.verify)
    assert small.status_code == 206 and small.content == data[:100]


def test_unsigned_bad_and_replayed_calls_to_every_mutating_route_are_401_and_change_nothing(
        cluster: ClusterInfo) -> None:
    async def scenario() -> None:
        async with ClusterClient(cluster.clustermgr_urls) as cm, BlobnodeClient() as bn:
            disk = (await cm.list_disks())[0]
            volume = (await cm.list_volumes())[0]
            unit = volume.units[0]
            with Client(cluster.access_urls, ca=cluster.ca) as client:
                client.put(os.urandom(5000))
            shards = await bn.list_shards(unit.host, unit.disk_id, unit.vuid)
            bid = shards[0].bid if shards else 1
            calls: list[tuple[str, str, dict[str, object]]] = [
                (unit.host, "/shard/delete", {"disk_id": unit.disk_id, "vuid": unit.vuid, "bid": bid}),
                (unit.host, "/shard/discard", {"disk_id": unit.disk_id, "vuid": unit.vuid, "bid": bid}),
                (unit.host, "/chunk/create", {"disk_id": disk.disk_id, "vuid": unit.vuid + 99}),
                (unit.host, "/chunk/release", {"disk_id": unit.disk_id, "vuid": unit.vuid}),
                (cluster.clustermgr_urls[0], "/disk/set", {"disk_id": disk.disk_id, "status": "broken"}),
                (cluster.clustermgr_urls[0], "/config/set", {"key": "switch/balance", "value": "off"}),
                (cluster.clustermgr_urls[0], "/kv/set", {"key": "intruder", "value": "x"}),
                (cluster.clustermgr_urls[0], "/raft/member/remove", {"node_id": 2}),
                (cluster.clustermgr_urls[0], "/volume/lock", {"vid": volume.vid}),
                (urls(cluster, "allocator")[0], "/alloc", {"code_mode": "EC3P3", "size": 10}),
                (urls(cluster, "mqproxy")[0], "/repairmsg", {"messages": [{"vid": 1, "bid": 1, "bad_indexes": [0]}]}),
                (urls(cluster, "worker")[0], "/shard/repair", {"vid": volume.vid, "bid": bid, "bad_indexes": [0]}),
                (urls(cluster, "scheduler")[0], "/task/migrate", {"vid": volume.vid, "index": 0}),
            ]
            stranger = Signer(AuthConfig.for_capabilities(new_secret(), Capability).keys)
            stale = Signer(AuthConfig.for_capabilities((Path(cluster.dir) / SECRET_FILE).read_text(), Capability).keys,
                           clock=lambda: time.time() - 120)
            async with httpx.AsyncClient(timeout=10, verify=cluster.verify) as raw:
                for host, path, body in calls:
                    for signer in (None, stranger, stale):
                        headers = {}
                        if signer is not None:
                            headers[AUTH_HEADER] = signer.header("POST", f"{host}{path}", None,
                                                                 httpx.Request("POST", "/", json=body).read(), CATALOG)
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


def _signed_as(capability: Capability, secret: str, method: str, url: str, body: bytes, name: str = "") -> str:
    """A header signed with `capability`'s key for a route that may take another one (what a service holding
    only that key could send)."""
    parts = urlsplit(url)
    key = bytes.fromhex(capability_key(secret, capability))  # an identity-bound one has no such key: a guess
    ts, nonce = str(int(time.time())), os.urandom(8).hex()
    sig = sign(key, method, parts.netloc, parts.path, "", body_digest(body), ts, capability, nonce, name)
    return f"v2 cap={capability} ts={ts} n={nonce}{f' id={name}' if name else ''} sig={sig}"


def test_least_privilege_each_attack_is_refused_and_changes_nothing(cluster: ClusterInfo) -> None:
    """The scheduler's own keys cannot change config; a data-path key cannot mark a disk; a blobnode cannot
    report another's disk; an unmarked shard is not deleted; a replayed or future-dated request is refused;
    bytes swapped under a valid shard put header are refused unstored."""
    secret = (Path(cluster.dir) / SECRET_FILE).read_text()
    operator = Signer(AuthConfig.for_capabilities(secret, Capability).keys)

    async def scenario() -> None:
        async with ClusterClient(cluster.clustermgr_urls) as cm, BlobnodeClient() as bn:
            leader = cluster.clustermgr_urls[((await cm.raft_status()).leader or 1) - 1]
            disks = await cm.list_disks()
            disk, other = disks[0], next(d for d in disks if d.host != disks[0].host)
            with Client(cluster.access_urls, ca=cluster.ca) as client:
                client.put(os.urandom(5000))
            held = [(u, await bn.list_shards(u.host, u.disk_id, u.vuid)) for u in
                    [v.units[0] for v in await cm.list_volumes()]]
            unit, shards = next((u, listed) for u, listed in held if listed)
            bid = shards[0].bid
        async with httpx.AsyncClient(timeout=10, verify=cluster.verify) as raw:
            async def post(url: str, body: dict[str, object], header: str) -> httpx.Response:
                content = json.dumps(body).encode()
                return await raw.post(url, content=content, headers={AUTH_HEADER: header,
                                                                     "content-type": "application/json"})

            def header_for(capability: Capability, url: str, body: dict[str, object], name: str = "") -> str:
                return _signed_as(capability, secret, "POST", url, json.dumps(body).encode(), name)

            # the scheduler holds kv and disk-status, not admin: config and membership stay out of its reach
            body = {"key": "switch/balance", "value": "off"}
            answer = await post(f"{leader}/config/set", body, header_for(Capability.KV, f"{leader}/config/set", body))
            assert answer.status_code == 403 and "admin" in answer.text, answer.text
            # a blobnode's identity reports only its own disks
            body = {"disk_id": other.disk_id}
            answer = await post(f"{leader}/disk/broken", body,
                                header_for(Capability.DISK_REPORT, f"{leader}/disk/broken", body, disk.host))
            assert answer.status_code == 401, answer.text  # no identity key of the caller's: cannot even sign it
            identity = AuthConfig.for_capabilities(secret, [Capability.OBSERVE], name=disk.host).identity
            assert identity is not None
            as_node = Signer({}, identity=identity)
            answer = await post(f"{leader}/disk/broken", body, as_node.header(
                "POST", f"{leader}/disk/broken", None, json.dumps(body).encode(), CATALOG))
            assert answer.status_code == 403 and "belongs to" in answer.text, answer.text
            # /shard/delete without tinker's ticket for the shard, whoever holds the delete key
            body = {"disk_id": unit.disk_id, "vuid": unit.vuid, "bid": bid}
            url = f"{unit.host}/shard/delete"
            answer = await post(url, body, header_for(Capability.DELETE_SHARD, url, body))
            assert answer.status_code == 403 and "delete ticket from tinker" in answer.text, answer.text
            # with it but without access's intent for the blob (which the delete message carries)
            tinkers = as_tinker(unit.host, unit.disk_id, unit.vuid, bid, secret.strip())
            ticketed = {**body, "ticket": tinkers["ticket"]}
            answer = await post(url, ticketed, header_for(Capability.DELETE_SHARD, url, ticketed))
            assert answer.status_code == 403 and "delete intent access signed" in answer.text, answer.text
            # with both, of a shard not marked deleted first
            ticketed["intent"] = tinkers["intent"].model_dump(mode="json")
            answer = await post(url, ticketed, header_for(Capability.DELETE_SHARD, url, ticketed))
            assert answer.status_code == 409 and "mark it first" in answer.text, answer.text
            # nor right after its mark: tinker's safe delay (the cluster's delete_delay) holds on the blobnode too
            await bn.mark_delete_shard(unit.host, unit.disk_id, unit.vuid, bid, **tinkers)
            answer = await post(url, ticketed, header_for(Capability.DELETE_SHARD, url, ticketed))
            assert answer.status_code == 409 and "delete_hold" in answer.text, answer.text
            # and tinker's delete key does not discard (a repair's at-once delete, the worker's capability)
            url = f"{unit.host}/shard/discard"
            answer = await post(url, body, header_for(Capability.DELETE_SHARD, url, body))
            assert answer.status_code == 403 and "discard-shard" in answer.text, answer.text
            await bn.unmark_delete_shard(unit.host, unit.disk_id, unit.vuid, bid)
            # the chunk key every blobnode holds releases no live chunk: that takes clustermgr's release ticket
            body = {"disk_id": unit.disk_id, "vuid": unit.vuid}
            url = f"{unit.host}/chunk/release"
            answer = await post(url, body, header_for(Capability.CHUNK, url, body))
            assert answer.status_code == 403 and "ticket_refused" in answer.text, answer.text
            assert (await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)).status == "normal"
            # a request signed for one blobnode, replayed to another (its Host header kept, or rewritten)
            body = {"disk_id": unit.disk_id, "vuid": unit.vuid, "bid": bid}
            content = json.dumps(body).encode()
            header = operator.header("POST", f"{unit.host}/shard/markdelete", None, content, CATALOG)
            stranger = next(d.host for d in disks if d.host != unit.host)
            elsewhere = f"{stranger}/shard/markdelete"
            for host in (urlsplit(unit.host).netloc, urlsplit(stranger).netloc):
                answer = await raw.post(elsewhere, content=content, headers={
                    AUTH_HEADER: header, "host": host, "content-type": "application/json"})
                assert answer.status_code == 401, answer.text
            # an export outside the blobnode's export roots (the cluster's folder)
            body = {"target": "/tmp/../etc/blobstore-export"}
            url = f"{unit.host}/inspect/export"
            answer = await post(url, body, header_for(Capability.EXPORT, url, body))
            assert answer.status_code == 403 and "export roots" in answer.text, answer.text
            assert not Path("/etc/blobstore-export").exists()
            # a replayed request, and one dated ahead of the server's clock
            body = {"key": "replay-probe", "value": "1"}
            header = operator.header("POST", f"{leader}/kv/set", None, json.dumps(body).encode(), CATALOG)
            assert (await post(f"{leader}/kv/set", body, header)).status_code == 200
            answer = await post(f"{leader}/kv/set", {**body}, header)
            assert answer.status_code == 401 and "used before" in answer.text, answer.text
            ahead = Signer(AuthConfig.for_capabilities(secret, [Capability.KV]).keys, clock=lambda: time.time() + 30)
            body = {"key": "replay-probe", "value": "2"}
            answer = await post(f"{leader}/kv/set", body, ahead.header("POST", f"{leader}/kv/set", None,
                                                                        json.dumps(body).encode(), CATALOG))
            assert answer.status_code == 401 and "ahead" in answer.text, answer.text
            # bytes swapped under a valid shard put header (same length, other CRC)
            good, evil = b"a" * 4096, b"b" * 4096
            params = {"disk_id": str(unit.disk_id), "vuid": str(unit.vuid), "bid": str(10**9),
                      "size": "4096", "crc": str(zlib.crc32(good))}
            url = f"{unit.host}/shard/put"
            header = operator.header("PUT", url, params, good, CATALOG)
            answer = await raw.put(url, params=params, content=evil, headers={AUTH_HEADER: header})
            assert answer.status_code == 400 and "CRC" in answer.text, answer.text
        async with ClusterClient(cluster.clustermgr_urls) as cm, BlobnodeClient() as bn:
            assert (await cm.get_config("switch/balance")) != "off"
            assert (await cm.get_disk(other.disk_id)).status is DiskStatus.NORMAL
            assert await cm.kv_get("replay-probe") == "1"
            assert (await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)).status == "normal"
            with pytest.raises(RpcError):
                await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, 10**9)

    asyncio.run(scenario())


def test_rotation_with_an_overlap_loses_no_request(blobnode_factory: BlobnodeFactory) -> None:
    old, new = new_secret(), new_secret()
    capabilities = [Capability.CHUNK, Capability.OBSERVE]
    node = blobnode_factory("rotating", disks=1,
                            auth=AuthConfig.for_capabilities(new, capabilities, old).model_dump(mode="json"))
    before = auth.installed()

    async def burst(secret: str) -> int:
        auth.install(Signer(AuthConfig.for_capabilities(secret, capabilities).keys))
        async with BlobnodeClient() as bn:
            await bn.create_chunk(node.url, 1, Vuid.make(1 if secret == old else 2, 0, 1))
            results = await asyncio.gather(*(bn.disk_stat(node.url, 1) for _ in range(50)), return_exceptions=True)
        return sum(not isinstance(r, Exception) for r in results)

    try:
        assert asyncio.run(burst(old)) == 50  # clients not yet given the new secret
        assert asyncio.run(burst(new)) == 50
    finally:
        auth.install(before)


# Bad input, signed (so it reaches the routes): every answer is a 4xx with a reason, or 503 where a dependency
# is away (a follower, no elected scheduler); never a 500; nothing stored changes.

ROUTES: dict[str, list[tuple[str, str]]] = {
    "blobnode": [("GET", "/stat"), ("GET", "/disk/stat"), ("POST", "/chunk/create"), ("POST", "/chunk/release"),
                 ("POST", "/chunk/readonly"), ("POST", "/chunk/compact"), ("GET", "/chunk/list"),
                 ("GET", "/chunk/stat"), ("GET", "/shard/stat"), ("GET", "/shard/list"), ("POST", "/shard/delete"),
                 ("POST", "/shard/discard"), ("POST", "/shard/markdelete"), ("POST", "/shard/put"),
                 ("PUT", "/shard/put_batch"), ("GET", "/shard/get"), ("GET", "/shard/get_batch"),
                 ("POST", "/inspect/export")],
    "clustermgr": [("POST", "/disk/add"), ("POST", "/disk/heartbeat"), ("POST", "/disk/set"), ("POST", "/disk/broken"),
                   ("GET", "/disk/get"), ("GET", "/volume/get"), ("GET", "/volume/list"), ("POST", "/volume/alloc"),
                   ("POST", "/volume/retain"), ("POST", "/volume/full"), ("POST", "/volume/lock"),
                   ("POST", "/volume/unit/alloc"), ("POST", "/volume/unit/update"), ("POST", "/scope/alloc"),
                   ("POST", "/service/register"),
                   ("POST", "/config/set"), ("POST", "/kv/cas"), ("GET", "/kv/list"), ("POST", "/raft/member/add"),
                   ("POST", "/raft/member/remove")],
    "allocator": [("POST", "/alloc")],
    "mqproxy": [("POST", "/repairmsg"), ("POST", "/deletemsg")],
    "worker": [("POST", "/shard/repair")],
    "scheduler": [("POST", "/task/acquire"), ("POST", "/task/renew"), ("POST", "/task/report"),
                  ("POST", "/task/complete"), ("POST", "/task/cancel"), ("POST", "/task/migrate")],
    "access": [("PUT", "/blob"), ("POST", "/blob/alloc"), ("PUT", "/blob/putat"), ("GET", "/blob/{token}"),
               ("GET", "/blob/{token}/stat"), ("DELETE", "/blob/{token}")],
}
FIELDS = ["vid", "bid", "disk_id", "vuid", "index", "size", "count", "code_mode", "key", "value", "status", "name",
          "host", "holder", "messages", "bad_indexes", "ref", "worker", "node_id", "expected", "disks", "volumes"]
WRONG = [-1, -(2**70), 2**70, 1.5, "x" * 300, "", None, [], {}, [1, "a"], {"a": {"b": []}}, True, "NaN", "1e999"]
QUERIES = ["disk_id=-1", "disk_id=abc&vuid=1&bid=1", "vuid=99999999999999999999999999", "count=0&start_bid=-5",
           "disk_id=1&vuid=1&bid=1&offset=-3", "bid=1&bid=2", "%zz=%zz", "disk_id=1&vuid=0&bid=0&size=99999999999",
           "token=AAAA", "token=" + "A" * 5000, "disk_id=1&vuid=4294967297&bid=1",
           "disk_id=1.1&vuid=1.1&bid=1.2&size=1.1&crc=1.1", "disk_id=1.&vuid=.1&bid=1..2&size=-1.1&crc=1",
           "bid=" + ".".join(["1"] * 70)]
RANGES = ["bytes=5-1", "bytes=abc", "bytes=-0", "bytes=999999999-", "bytes=0-0,5-9", "items=0-1", "bytes=--1"]


def bad_bodies(rng: random.Random) -> list[bytes]:
    wrong = {f: rng.choice(WRONG) for f in rng.sample(FIELDS, 4)}
    return [b"", b"{", b"[]", b"null", b'"text"', json.dumps(wrong).encode(), json.dumps(wrong).encode()[:-3],
            bytes(rng.getrandbits(8) for _ in range(300)), json.dumps({**wrong, "unknown": 1}).encode()]


def forged_tokens(real: str, rng: random.Random) -> list[str]:
    flipped = list(real)
    flipped[len(real) // 2] = "A" if flipped[len(real) // 2] != "A" else "B"
    return [real[:-4], "".join(flipped), "A" * 54, real + "AAAA", "..%2f..%2fetc", "".join(rng.choices("ab-_", k=60))]


def snapshot(cluster: ClusterInfo) -> dict[str, object]:
    async def take() -> dict[str, object]:
        async with ClusterClient(cluster.clustermgr_urls) as cm, BlobnodeClient() as bn:
            disks = await cm.list_disks()
            chunks = {d.disk_id: sorted((c.vuid, c.status) for c in await bn.list_chunks(d.host, d.disk_id))
                      for d in disks}
            volatile = ("scheduler/", "volume_inspect/", "task/", "raft_member_http/")
            return {"disks": [(d.disk_id, d.status, d.readonly) for d in disks],
                    "volumes": [(v.vid, v.status, [u.vuid for u in v.units]) for v in await cm.list_volumes()],
                    "config": await cm.list_config(),
                    "kv": {k: v for k, v in (await cm.kv_list()).items() if not k.startswith(volatile)},
                    "chunks": chunks}

    return asyncio.run(take())


async def _leaders(cluster: ClusterInfo) -> tuple[str, str]:
    async with ClusterClient(cluster.clustermgr_urls) as cm:
        leader = (await cm.raft_status()).leader or 1
        raw = await cm.kv_get(LEADER_KEY)
    return cluster.clustermgr_urls[leader - 1], LeaderRecord.model_validate_json(raw or "").host


def truncated(url: str, method: str, signer: Signer, cluster: ClusterInfo) -> None:
    """A body cut short of its declared length, the connection then closed: the service stays up."""
    parts = urlsplit(url)
    head = f"{method} {parts.path} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-length: 5000\r\n"
    head += f"{AUTH_HEADER}: {signer.header(method, url, None, b'x' * 5000, CATALOG)}\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as raw:
        sock = raw
        if parts.scheme == "https":
            sock = ssl.create_default_context(cafile=cluster.ca).wrap_socket(raw, server_hostname=parts.hostname)
        sock.sendall(head.encode() + b"\r\n" + b"x" * 100)
    assert httpx.get(f"{parts.scheme}://{parts.netloc}/health", timeout=5, verify=cluster.verify).status_code == 200


def test_bad_input_to_every_route_is_a_4xx_and_changes_nothing(cluster: ClusterInfo) -> None:
    rng = random.Random(13)
    with Client(cluster.access_urls, ca=cluster.ca) as client:
        real = client.put(os.urandom(3000))
    before = snapshot(cluster)
    hosts = {role: urls(cluster, role)[0] for role in ROUTES}
    hosts["clustermgr"], hosts["scheduler"] = asyncio.run(_leaders(cluster))  # past the "not the leader" answer
    signer = auth.installed()
    assert signer is not None
    failures: list[str] = []
    with httpx.Client(timeout=30, verify=cluster.verify) as raw:
        def send(method: str, url: str, body: bytes, headers: dict[str, str]) -> None:
            if not url.startswith(f"{hosts['access']}/"):  # access1: its API is public
                headers = {**headers, AUTH_HEADER: signer.header(method, url, None, body if body else None, CATALOG)}
            answer = raw.request(method, url, content=body, headers=headers)
            text = answer.text[:200]
            reason = answer.headers.get("content-type", "").startswith("application/json") and (
                "error" in answer.json() or "detail" in answer.json())
            if (answer.status_code >= 500 and answer.status_code != 503) or (answer.status_code >= 400 and not reason):
                failures.append(f"{method} {url[:120]} {body[:60]!r} -> {answer.status_code} {text}")

        for role, routes in ROUTES.items():
            for method, path in routes:
                for token in [real, *forged_tokens(real, rng)] if "{token}" in path else [""]:
                    target = f"{hosts[role]}{path.replace('{token}', token)}"
                    if token == real:
                        for value in RANGES:
                            send("GET", target, b"", {"range": value})
                        continue
                    for query in rng.sample(QUERIES, 4):
                        send(method, f"{target}?{query}", b"", {})
                    for body in bad_bodies(rng):
                        send(method, target, body, {"content-type": "application/json"})
                    send("PATCH", target, b"{}", {})  # a method the route does not take
                    truncated(target, method, signer, cluster)
        # otherwise valid bodies with a field the service does not know: refused, not half understood
        disk = before["disks"][0][0]  # type: ignore[index]
        for url, body in [(f"{hosts['clustermgr']}/kv/set", {"key": "fuzz", "value": "x", "ttl": 5}),
                          (f"{hosts['clustermgr']}/disk/set", {"disk_id": disk, "status": "broken", "force": True}),
                          (f"{hosts['blobnode']}/chunk/create", {"disk_id": disk, "vuid": 1 << 32 | 1, "size": 1})]:
            content = json.dumps(body).encode()
            header = signer.header("POST", url, None, content, CATALOG)
            answer = raw.post(url, content=content, headers={"content-type": "application/json", AUTH_HEADER: header})
            assert answer.status_code == 400 and "extra" in answer.text.lower(), (url, answer.text)
    assert not failures, "\n".join(failures[:20])
    assert snapshot(cluster) == before


def test_the_raft_port_admits_only_members(cluster: ClusterInfo) -> None:
    config = json.loads(Path(next(p.config for p in cluster.processes if p.role == "clustermgr")).read_text())
    host, port = config["members"][str(config["node_id"])]["raft_addr"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        sock = raw  # over TLS on a cluster of several hosts (test_cluster_tls.py): a member proof still to give
        if cluster.ca:
            sock = ssl.create_default_context(cafile=cluster.ca).wrap_socket(raw, server_hostname=host)
        assert len(sock.recv(64)) == 16  # the challenge
        sock.sendall(b"\0" * 32 + b"\0\0\0\x05hello")  # a wrong answer, then a frame
        sock.settimeout(5)
        assert sock.recv(64) == b""  # hung up on
    with Client(cluster.access_urls, ca=cluster.ca) as client:  # the replicas still talk to each other
        assert client.get(client.put(b"after the intruder")) == b"after the intruder"


def test_a_forged_delete_message_deletes_nothing_and_a_real_delete_still_does(cluster: ClusterInfo) -> None:
    """A Kafka writer without the message key (one holding mqproxy's Kafka login): its delete (unsealed, or sealed
    with another key) is logged, counted and committed past by tinker, and the blob still reads; a DELETE through
    access still deletes."""
    secret = (Path(cluster.dir) / SECRET_FILE).read_text().strip()
    writer, reader = (client_auth(kafka_user(secret, user, cluster_ca(Path(cluster.dir))))
                      for user in ("mqproxy", "backlog"))
    tinker = next(p for p in cluster.processes if p.role == "tinker")
    forged = "blobstore_tinker_messages_forged_total", {"topic": str(Topic.BLOB_DELETE)}
    with Client(cluster.access_urls, ca=cluster.ca) as client:
        location = client.put(b"not yours to delete")
        blob = client.stat(location).blobs[0]
        before = sample(tinker.url, *forged)
        msg = DeleteMsg(cluster_id=1, vid=blob.vid, bid=blob.min_bid, time=time.time() - 3600)  # long past due

        async def produce() -> list[tuple[int, int]]:
            plain = await Producer.connect(cluster.kafka_bootstrap, **writer)
            stranger = await Producer.connect(cluster.kafka_bootstrap, seal_key=message_key(new_secret()), **writer)
            try:
                return [await p.send(Topic.BLOB_DELETE, msg.key(), msg.to_bytes()) for p in (plain, stranger)]
            finally:
                await plain.close()
                await stranger.close()

        sent = asyncio.run(produce())

        def consumed_past() -> bool:
            at = positions(cluster.kafka_bootstrap, "tinker-delete", [Topic.BLOB_DELETE], client=reader)
            return all(at[(Topic.BLOB_DELETE, partition)][0] > offset for partition, offset in sent)

        wait_until(consumed_past, 20, "tinker to commit past the forged messages")
        assert sample(tinker.url, *forged) == before + 2
        assert client.get(location) == b"not yours to delete"
        log = Path(tinker.log).read_text()
        for partition, offset in sent:  # a warning, once per message
            assert log.count(f"forged message {Topic.BLOB_DELETE}/{partition}@{offset} ") == 1

        client.delete(location)

        def gone() -> bool:
            try:
                client.get(location)
            except NotFound:
                return True
            return False

        wait_until(gone, 20, "the sealed delete to be done")
    assert sample(tinker.url, *forged) == before + 2


def test_redis_refuses_a_client_without_the_password_which_no_status_shows(cluster: ClusterInfo) -> None:
    secret = (Path(cluster.dir) / SECRET_FILE).read_text().strip()
    password = redis_password(secret)
    with pytest.raises(redis.AuthenticationError):
        redis_client(cluster, cluster.redis_url).ping()
    with pytest.raises(redis.AuthenticationError):
        redis_client(cluster, with_credentials(cluster.redis_url, new_secret())).ping()
    with pytest.raises(redis.AuthenticationError):
        redis_client(cluster, cluster.redis_url, username="default", password=password).ping()
    with redis_client(cluster, with_credentials(cluster.redis_url, secret)) as good:
        assert good.ping()
    status = CliRunner().invoke(app, ["cluster", "status", "--dir", cluster.dir])
    assert status.exit_code == 0, status.output
    assert password not in status.output
    assert password not in httpx.get(cluster.dashboard_url, timeout=10, verify=cluster.verify).text
    configs = {Path(p.config) for p in cluster.processes if p.role == "access"}
    for path in Path(cluster.dir).rglob("*"):  # logs, cluster.json, the other configs, redis.conf (a hash)
        if path.is_file() and path not in configs:
            assert password.encode() not in path.read_bytes(), path


def test_a_poisoned_redis_entry_is_refetched_from_clustermgr(cluster: ClusterInfo) -> None:
    """Redis is a cache: a unit->host answer that a blobnode contradicts ("no such disk") is dropped and the
    volume fetched again from clustermgr, so a GET still reads and the entry is put right."""
    secret = (Path(cluster.dir) / SECRET_FILE).read_text().strip()
    data = os.urandom(20_000)
    with Client(cluster.access_urls[:1], ca=cluster.ca) as client:
        location = client.put(data)
        vid = client.stat(location).blobs[0].vid
    truth = asyncio.run(_volume(cluster, vid))
    wrong = truth.units[1].host  # a blobnode of the cluster, which has no disk truth.units[0].disk_id
    poisoned = truth.model_copy(update={"units": [truth.units[0].model_copy(update={"host": wrong}),
                                                  *truth.units[1:]]})
    key = f"blobstore:1:volume:{vid}"
    access2 = [p for p in cluster.processes if p.role == "access"][1]
    os.kill(access2.pid, signal.SIGTERM)  # so that it has no copy of its own: it reads Redis first
    wait_until(lambda: not ClusterInfo.load(Path(cluster.dir)).processes[
        cluster.processes.index(access2)].running, 20, f"{access2.name} to stop")
    with redis_client(cluster, with_credentials(cluster.redis_url, secret)) as cache:
        cache.set(key, poisoned.model_dump_json(), ex=300)
        restart(Path(cluster.dir), access2.name)
        with Client(cluster.access_urls[1:], ca=cluster.ca) as client:
            assert client.get(location) == data
        cached = cache.get(key)
    assert cached is not None
    assert VolumeInfo.model_validate_json(cached).units[0].host == truth.units[0].host


async def _volume(cluster: ClusterInfo, vid: int) -> VolumeInfo:
    async with ClusterClient(cluster.clustermgr_urls) as cm:
        return await cm.get_volume(vid)
