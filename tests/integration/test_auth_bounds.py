"""Attacks by a holder of some keys on real clustermgr, blobnode and allocator processes (issue 65, round 3):
a captured request replayed after its verifier restarted, a session header stripped or altered under a good
signature, a scope run out, another allocator's lease released, the nonce cache flooded. Each is refused and
leaves the cluster working."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from blobstore.signing import auth_header
from blobstore_server.cluster.service_auth import role_auth
from blobstore_server.libs.proto.clustermgr import SESSION_HEADER
from blobstore_server.libs.proto.routes import CATALOG
from blobstore_server.libs.rpc.auth import AUTH_HEADER, OPERATOR, AuthConfig, Signer, body_digest, sign
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support.processes import BlobnodeFactory, Service, free_port, wait_until
from tests.support.waiting import eventually

C = Capability
ClusterMgrFactory = Callable[..., list[Service]]
FAST = {"volume_check_interval": 0.2, "disk_heartbeat_timeout": 10, "volume_lease_ttl": 10, "chunk_size": 64 << 20,
        "code_modes": [{"code_mode": "EC3P3", "min_volumes": 2}], "first_volume_after_disks": 6}


def as_operator(secret: str) -> Signer:
    return Signer.from_config(AuthConfig.for_capabilities(secret, Capability, name=OPERATOR))


def as_allocator(secret: str, name: str) -> Signer:
    """An allocator's keys: `allocate` (shared with access), and its own identity for `lease`."""
    return Signer.from_config(AuthConfig.for_capabilities(secret, [C.ALLOCATE, C.OBSERVE, C.LEASE], name=name))


def with_allocate_key(secret: str, url: str, body: dict[str, object]) -> tuple[bytes, dict[str, str]]:
    """A request signed with what access holds of the allocators' keys, the shared `allocate` one, whatever
    capability its route takes (as one holding only that key could send it)."""
    content, parts = json.dumps(body).encode(), urlsplit(url)
    key = bytes.fromhex(AuthConfig.for_capabilities(secret, [C.ALLOCATE]).keys[C.ALLOCATE])
    ts, nonce = str(int(time.time())), os.urandom(8).hex()
    sig = sign(key, "POST", parts.netloc, parts.path, "", body_digest(content), ts, C.ALLOCATE, nonce, "")
    return content, {"content-type": "application/json", AUTH_HEADER: auth_header(C.ALLOCATE, ts, nonce, sig)}


def signed(signer: Signer, url: str, body: dict[str, object], session: str = "") -> tuple[bytes, dict[str, str]]:
    content = json.dumps(body).encode()
    headers = {"content-type": "application/json",
               AUTH_HEADER: signer.header("POST", url, None, content, CATALOG, session)}
    return content, headers | ({SESSION_HEADER: session} if session else {})


def post(url: str, content: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url, content=content, headers=headers, timeout=10)


def served(cm: Service, secret: str) -> bool:
    """Whether clustermgr applies a fresh write (signed as every client signs each attempt): it leads."""
    url = f"{cm.url}/kv/set"
    return post(url, *signed(as_operator(secret), url, {"key": "probe", "value": "0"})).status_code == 200


def next_second() -> None:
    """Wait until the clock has passed into the next second: a service started after this started after every
    signature made before it."""
    second = int(time.time())
    wait_until(lambda: int(time.time()) > second, 2.0, "the next second")


def test_a_request_replayed_after_its_verifier_restarts_or_with_its_session_changed_is_refused(
        clustermgr_factory: ClusterMgrFactory, signed_as_operator: str) -> None:
    secret = signed_as_operator
    [cm] = clustermgr_factory(1, **FAST)
    url = f"{cm.url}/kv/set"
    wait_until(lambda: served(cm, secret), 15.0, "the replica leading")
    content, headers = signed(as_operator(secret), url, {"key": "probe", "value": "1"}, session="attacker 5 4")
    # the same signature with its session stripped, or its seq or fence moved: refused before anything applies
    stripped = {k: v for k, v in headers.items() if k != SESSION_HEADER}
    for changed in (stripped, headers | {SESSION_HEADER: "attacker 6 4"},
                    headers | {SESSION_HEADER: "attacker 5 4 scheduler/leader 9"}):
        answer = post(url, content, changed)
        assert answer.status_code == 401 and "bad signature" in answer.text, answer.text
    assert post(url, content, headers).status_code == 200
    # the verifier restarts: it forgot the nonces it took, and takes no signature from before it started
    next_second()
    cm.stop()
    cm.start()
    wait_until(lambda: served(cm, secret), 15.0, "the restarted replica leading")  # clients sign anew: served
    answer = post(url, content, headers)
    assert answer.status_code == 401 and "before this service started" in answer.text, answer.text


def test_the_allocate_key_can_neither_run_out_a_scope_nor_take_a_lease_nor_starve_other_callers(
        clustermgr_factory: ClusterMgrFactory, blobnode_factory: BlobnodeFactory, signed_as_operator: str,
        tmp_path: Path) -> None:
    secret = signed_as_operator
    auth = role_auth(secret, "clustermgr", {}) | {"nonces": 600}  # each caller may fill 300 of them
    [cm] = clustermgr_factory(1, auth=auth, **FAST)
    wait_until(lambda: served(cm, secret), 15.0, "the replica leading")
    scope = f"{cm.url}/scope/alloc"
    # access's allocate key no longer reaches clustermgr's lease routes; an allocator's own key is bounded
    answer = post(scope, *with_allocate_key(secret, scope, {"name": "vid", "count": 1 << 32}))
    assert answer.status_code == 401 and "takes no allocate" in answer.text, answer.text
    rogue = as_allocator(secret, "http://127.0.0.1:1")
    for body, reason in (({"name": "vid", "count": 1 << 32}, "not handed out"),
                         ({"name": "vid", "count": 1}, "not handed out"),
                         ({"name": "bid", "count": 1 << 32}, "at most")):
        answer = post(scope, *signed(rogue, scope, body))
        assert answer.status_code == 400 and reason in answer.text, answer.text
    # volume creation still works: the blobnodes register, clustermgr creates volumes from vid 1
    for i in range(6):
        blobnode_factory(f"bn{i}", disks=1, clustermgr=[cm], wait=False)

    async def volumes() -> list[int]:
        async with ClusterClient([cm.url]) as c:
            return await eventually(lambda: _vids(c, 2), 30, "two volumes")

    assert asyncio.run(volumes())[:2] == [1, 2]
    # a real allocator leases volumes under its own name
    port = free_port()
    workdir = tmp_path / "alloc"
    workdir.mkdir()
    allocator = Service("allocator", {"bind_addr": f"127.0.0.1:{port}", "clustermgr_hosts": [cm.url],
                                      "code_modes": ["EC3P3"], "retain_interval": 1.0, "volumes_per_mode": 1},
                        workdir, f"http://127.0.0.1:{port}")
    try:
        allocator.start(30.0)

        async def leased() -> list[int]:
            async with ClusterClient([cm.url]) as c:
                return await eventually(lambda: _held_by(c, allocator.url), 30, "a lease of the allocator's")

        vid = asyncio.run(leased())[0]
        release = f"{cm.url}/volume/release"
        body = {"vid": vid, "holder": allocator.url}
        answer = post(release, *with_allocate_key(secret, release, body))
        assert answer.status_code == 401 and "takes no allocate" in answer.text, answer.text
        answer = post(release, *signed(rogue, release, body))  # another allocator's own key
        assert answer.status_code == 403 and "own name" in answer.text, answer.text
        retain = f"{cm.url}/volume/retain"
        answer = post(retain, *signed(rogue, retain, {"holder": allocator.url, "volumes": [{"vid": vid}]}))
        assert answer.status_code == 403 and "own name" in answer.text, answer.text

        async def still_held() -> None:
            async with ClusterClient([cm.url]) as c:
                volume = await c.get_volume(vid)
                assert volume.status == "active" and volume.lease_holder == allocator.url, volume

        asyncio.run(still_held())
        # the rogue allocator floods the nonce cache: its share fills and it is refused, the others are served
        refused = 0
        with httpx.Client(timeout=10) as raw:
            for _ in range(400):
                content, headers = signed(rogue, scope, {"name": "vid", "count": 1})
                status = raw.post(scope, content=content, headers=headers).status_code
                assert status in (400, 503), status
                refused += status == 503
        assert refused >= 100, refused
        answer = post(scope, *signed(as_allocator(secret, allocator.url), scope, {"name": "bid", "count": 10}))
        assert answer.status_code == 200, answer.text
        asyncio.run(still_held())  # and the real allocator still renews its lease (its own share)
        alloc = f"{allocator.url}/alloc"
        answer = post(alloc, *with_allocate_key(secret, alloc, {"code_mode": "EC3P3", "size": 100}))
        assert answer.status_code == 200 and answer.json()["blobs"], answer.text
    finally:
        allocator.stop()


async def _vids(c: ClusterClient, count: int) -> list[int]:
    """The vids of every volume once there are `count` ([] before)."""
    vids = sorted(v.vid for v in await c.list_volumes())
    return vids if len(vids) >= count else []


async def _held_by(c: ClusterClient, holder: str) -> list[int]:
    return [v.vid for v in await c.list_volumes() if v.lease_holder == holder]
