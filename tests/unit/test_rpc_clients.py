"""Policy above the service clients, over the fake transport (`libs.rpc.testing`): which host is asked,
what is retried, and what an answer becomes. Real processes test the same clients end to end."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import pytest

from blobstore_server.libs.proto.allocator import AllocRequest, AllocResult, BlobSlice
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import SESSION_HEADER, LeaderView, MaybeValue, ScopeRange, VolumeView
from blobstore_server.libs.rpc import errors
from blobstore_server.libs.rpc.client import HttpClient, Request
from blobstore_server.libs.rpc.testing import FakeReply, FakeTransport
from blobstore_server.services.allocator.client import AllocatorClient
from blobstore_server.services.clustermgr.client import ClusterClient, VolumeCache

Handler = Callable[[Request], Awaitable[FakeReply]]
HOSTS = ["http://cm1", "http://cm2", "http://cm3"]


def fake(handler: Handler) -> tuple[HttpClient, FakeTransport]:
    transport = FakeTransport(handler)
    return HttpClient(transport), transport


def host_of(request: Request) -> str:
    return request.url.split("/")[0] + "//" + request.url.split("/")[2]


def test_the_cluster_client_follows_a_followers_leader_hint_and_remembers_it() -> None:
    async def handler(request: Request) -> FakeReply:
        if host_of(request) != "http://cm3":
            return FakeReply.of(errors.NotLeader("not me", leader="http://cm3"))
        return FakeReply.of(ScopeRange(name="bid", start=1, end=10))

    http, transport = fake(handler)
    client = ClusterClient(HOSTS, http=http)
    assert asyncio.run(client.alloc_scope("bid", 10)).end == 10
    assert asyncio.run(client.alloc_scope("bid", 10)).start == 1
    assert [host_of(r) for r in transport.requests] == ["http://cm1", "http://cm3", "http://cm3"]


class Replicas:
    """Three fake clustermgr replicas as `ClusterClient` sees them: one leads; a paused one answers
    nothing until the request's own timeout; a down one refuses at once; `slow` requests take that
    long. Records each command (not the leader look-ups) with its session header and timeout."""

    def __init__(self, leader: str, term: int = 2) -> None:
        self.leader, self.term = leader, term
        self.paused: set[str] = set()
        self.down: set[str] = set()
        self.slow = 0.0
        self.commands: list[tuple[str, str | None, float | None]] = []  # (host, session header, timeout)

    async def handle(self, request: Request) -> FakeReply:
        host = host_of(request)
        lookup = request.url.endswith("/raft/leader")
        if host in self.down:
            raise errors.Unavailable(f"{host}: connection refused")
        if not lookup:
            self.commands.append((host, request.headers.get(SESSION_HEADER), request.timeout))
        if host in self.paused:
            await asyncio.sleep(request.timeout or 60)
            raise errors.Unavailable(f"{host}: timed out")
        if lookup:
            role = "leader" if host == self.leader else "follower"
            return FakeReply.of(LeaderView(node_id=HOSTS.index(host) + 1, role=role, term=self.term,
                                           leader=self.leader))
        if host != self.leader:
            return FakeReply.of(errors.NotLeader("not me", leader=self.leader))
        if self.slow > (request.timeout or 60):
            await asyncio.sleep(request.timeout or 60)
            raise errors.Unavailable(f"{host}: timed out")
        await asyncio.sleep(self.slow)
        if request.method == "POST":
            return FakeReply.of(ScopeRange(name="bid", start=1, end=10))
        return FakeReply.of(MaybeValue(key="k", value="v"))


def test_a_calm_call_is_one_request_and_only_writes_carry_a_session() -> None:
    replicas = Replicas(leader="http://cm1")
    client = ClusterClient(HOSTS, http=fake(replicas.handle)[0])

    async def calls() -> None:
        assert await client.kv_get("k") == "v"
        await client.alloc_scope("bid", 10)
        await client.alloc_scope("bid", 10)

    asyncio.run(calls())
    sessions = [header for _, header, _ in replicas.commands]
    assert [host for host, _, _ in replicas.commands] == ["http://cm1"] * 3
    assert sessions[0] is None and sessions[1:] == [f"{client.session.client} 1 0", f"{client.session.client} 2 1"]
    plain = Replicas(leader="http://cm1")
    asyncio.run(ClusterClient(HOSTS, http=fake(plain.handle)[0], sessions=False).alloc_scope("bid", 10))
    assert plain.commands[0][1] is None  # like curl: applied without retry protection


def test_the_cluster_client_skips_an_unreachable_replica() -> None:
    replicas = Replicas(leader="http://cm2")
    replicas.down.add("http://cm1")
    http, transport = fake(replicas.handle)
    assert asyncio.run(ClusterClient(HOSTS, http=http).kv_get("k")) == "v"
    assert [host for host, _, _ in replicas.commands] == ["http://cm2"]
    assert {host_of(r) for r in transport.requests if r.url.endswith("/raft/leader")} == set(HOSTS)


def test_a_paused_leader_costs_one_attempt_timeout_then_every_replica_is_asked_at_once() -> None:
    replicas = Replicas(leader="http://cm1")
    client = ClusterClient(HOSTS, http=fake(replicas.handle)[0], attempt_timeout=0.2)

    async def scenario() -> float:
        await client.alloc_scope("bid", 10)
        replicas.paused.add("http://cm1")  # alive but stopped; cm2 wins the election
        replicas.leader, replicas.term = "http://cm2", 3
        started = time.monotonic()
        await client.alloc_scope("bid", 10)
        return time.monotonic() - started

    waited = asyncio.run(scenario())
    assert 0.2 <= waited < 0.2 + 0.15  # one attempt timeout, then a parallel look-up (cm1 is not waited for)
    hosts, sessions, _ = zip(*replicas.commands, strict=True)
    assert hosts == ("http://cm1", "http://cm1", "http://cm2")
    assert sessions[1] == sessions[2]  # the retry is the same command: clustermgr applies it once


def test_followers_still_naming_a_paused_leader_are_not_followed_back_to_it() -> None:
    replicas = Replicas(leader="http://cm1")
    replicas.paused.add("http://cm1")  # the others have not noticed yet: they point to it
    client = ClusterClient(HOSTS, http=fake(replicas.handle)[0], attempt_timeout=0.2)

    async def scenario() -> float:
        started = time.monotonic()
        task = asyncio.ensure_future(client.kv_get("k"))
        await asyncio.sleep(0.3)
        replicas.leader, replicas.term = "http://cm3", 3  # elected meanwhile
        assert await task == "v"
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 0.3 + 0.3
    assert [host for host, _, _ in replicas.commands] == ["http://cm1", "http://cm3"]


def test_a_slow_but_live_leader_is_retried_with_a_longer_attempt_timeout() -> None:
    replicas = Replicas(leader="http://cm1")
    replicas.slow = 0.3
    client = ClusterClient(HOSTS, http=fake(replicas.handle)[0], attempt_timeout=0.2)
    assert asyncio.run(client.kv_get("k")) == "v"
    assert [(host, timeout) for host, _, timeout in replicas.commands] == [("http://cm1", 0.2), ("http://cm1", 0.4)]


def test_concurrent_writes_of_one_client_acknowledge_only_what_settled() -> None:
    replicas = Replicas(leader="http://cm1")
    replicas.slow = 0.05
    client = ClusterClient(HOSTS, http=fake(replicas.handle)[0])

    async def writes() -> None:
        first = asyncio.ensure_future(client.alloc_scope("bid", 1))
        await asyncio.sleep(0.01)
        await asyncio.gather(client.alloc_scope("bid", 1), first)
        await client.alloc_scope("bid", 1)

    asyncio.run(writes())
    seq_acked = [tuple(map(int, header.split()[1:])) for _, header, _ in replicas.commands if header]
    assert seq_acked == [(1, 0), (2, 0), (3, 2)]  # 2 was sent while 1 was in flight


def test_a_refusal_is_the_peers_typed_error_and_is_not_retried() -> None:
    async def handler(request: Request) -> FakeReply:
        return FakeReply.of(errors.Conflict("kv 'k' is 'x', expected None"))

    http, transport = fake(handler)
    with pytest.raises(errors.Conflict, match="expected None"):
        asyncio.run(ClusterClient(HOSTS, http=http).kv_cas("k", None, "v"))
    assert len(transport.requests) == 1
    assert transport.requests[0].headers["content-type"] == "application/json"
    assert transport.requests[0].body == b'{"key":"k","expected":null,"value":"v"}'


def test_an_answer_of_the_wrong_shape_is_an_internal_error_not_a_crash() -> None:
    async def handler(request: Request) -> FakeReply:
        return FakeReply(200, b'{"unexpected": true}')

    http, _ = fake(handler)
    with pytest.raises(errors.Internal, match="not a ScopeRange"):
        asyncio.run(ClusterClient(HOSTS, http=http).alloc_scope("bid", 1))


def test_the_allocator_client_tries_every_allocator_once() -> None:
    async def handler(request: Request) -> FakeReply:
        if host_of(request) == "http://a1":
            raise errors.Unavailable("down")
        return FakeReply.of(AllocResult(code_mode=1, blobs=[BlobSlice(vid=3, min_bid=7, count=2)]))

    http, transport = fake(handler)
    client = AllocatorClient(["http://a1", "http://a2"], http=http)
    for _ in range(50):  # the order is random: until one request met the failing allocator first (2^-50 never)
        assert asyncio.run(client.alloc(1, 100, 4096)) == [BlobSlice(vid=3, min_bid=7, count=2)]
        if "http://a1" in {host_of(r) for r in transport.requests}:
            break
    assert {host_of(r) for r in transport.requests} == {"http://a1", "http://a2"}

    async def all_down(request: Request) -> FakeReply:
        raise errors.Unavailable("down")

    with pytest.raises(errors.Unavailable, match="no allocator could allocate"):
        asyncio.run(AllocatorClient(["http://a1", "http://a2"], http=fake(all_down)[0]).alloc(1, 100, 4096))


def test_an_allocator_that_does_not_answer_is_passed_over_until_a_probe_finds_it_back() -> None:
    reachable = {"http://a1": False, "http://a2": True}
    granted = AllocResult(code_mode=1, blobs=[BlobSlice(vid=3, min_bid=7, count=1)])

    async def handler(request: Request) -> FakeReply:
        assert request.timeout == 0.5  # each attempt is bounded, not the client's 10 s
        if not reachable[host_of(request)]:
            raise errors.Unreachable("connection refused")
        return FakeReply.of(granted)

    http, transport = fake(handler)
    client = AllocatorClient(["http://a1", "http://a2"], http=http, attempt_timeout=0.5, punish=60.0)
    for _ in range(10):
        assert asyncio.run(client.alloc(1, 100, 4096)) == granted.blobs
    assert [host_of(r) for r in transport.requests].count("http://a1") <= 1  # once seen down, not asked again

    reachable["http://a2"] = False
    with pytest.raises(errors.Unavailable):
        asyncio.run(client.alloc(1, 100, 4096))
    transport.requests.clear()
    with pytest.raises(errors.Unavailable, match="none of 2 answered lately"):
        asyncio.run(client.alloc(1, 100, 4096))  # every allocator passed over: fails at once, asks nobody
    assert transport.requests == []

    reachable["http://a1"] = True
    assert asyncio.run(client.alloc(1, 100, 4096, probe=True)) == granted.blobs  # a probe asks them all
    transport.requests.clear()
    assert asyncio.run(client.alloc(1, 100, 4096)) == granted.blobs
    assert {host_of(r) for r in transport.requests} == {"http://a1"}


def test_an_allocator_that_answers_it_cannot_allocate_is_not_passed_over() -> None:
    async def handler(request: Request) -> FakeReply:
        return FakeReply.of(errors.Unavailable("no volume has room"))

    http, transport = fake(handler)
    client = AllocatorClient(["http://a1", "http://a2"], http=http)
    for _ in range(3):
        with pytest.raises(errors.Unavailable, match="no volume has room"):
            asyncio.run(client.alloc(1, 100, 4096))
    assert len(transport.requests) == 6


def test_volumes_found_full_go_with_requests_until_an_allocator_answered_one() -> None:
    granted = AllocResult(code_mode=1, blobs=[BlobSlice(vid=4, min_bid=7, count=1)])
    answers: list[errors.RpcError | AllocResult] = [errors.Unreachable("connection refused"),
                                                    errors.Unavailable("no volume has room"), granted, granted]
    sent: list[list[int]] = []

    async def handler(request: Request) -> FakeReply:
        assert request.body is not None
        sent.append(AllocRequest.model_validate_json(bytes(request.body)).full_vids)
        answer = answers.pop(0)
        if isinstance(answer, errors.Unreachable):
            raise answer
        return FakeReply.of(answer)

    client = AllocatorClient(["http://a1"], http=fake(handler)[0], punish=0.0)
    client.volume_full(3)
    client.volume_full(3)
    for _ in range(2):
        with pytest.raises(errors.Unavailable):
            asyncio.run(client.alloc(1, 100, 4096))
    for _ in range(2):
        asyncio.run(client.alloc(1, 100, 4096))
    assert sent == [[3], [3], [3], []]  # told again until an allocator answered (it may take it twice)


def test_an_unavailable_error_says_when_to_retry_in_its_header() -> None:
    assert errors.Unavailable("busy", retry_after=4.2).headers() == {"retry-after": "5"}
    assert errors.Unavailable("busy", retry_after=0.1).headers() == {"retry-after": "1"}
    assert errors.Unavailable("busy").headers() == {}
    reply = FakeReply.of(errors.Unavailable("busy", retry_after=5))
    rebuilt = errors.error_from_response(reply.status, json.loads(reply.body))
    assert type(rebuilt) is errors.Unavailable and rebuilt.details["retry_after"] == 5
    assert type(errors.error_from_response(503, errors.Unreachable("x").to_json())) is errors.Unavailable


def test_the_volume_cache_serves_an_expired_entry_only_while_clustermgr_is_unreachable() -> None:
    volume = VolumeView(vid=5, code_mode=11, backend="isal", units=[], capacity=100)
    down = False

    async def handler(request: Request) -> FakeReply:
        if down:
            raise errors.Unreachable("connection refused")
        return FakeReply.of(volume)

    async def scenario() -> None:
        nonlocal down
        http, transport = fake(handler)
        cache = VolumeCache(ClusterClient(HOSTS, http=http, deadline=0.2), ttl=0.01)
        assert (await cache.get(5)).vid == 5
        await asyncio.sleep(0.02)
        down = True
        assert (await cache.get(5)).vid == 5  # expired, but nothing better can be had
        asked = len(transport.requests)
        await asyncio.sleep(0.02)
        assert (await cache.get(5)).vid == 5 and len(transport.requests) == asked  # not asked again at once
        with pytest.raises(errors.Unavailable):
            await cache.get(6)  # never known: no guess
        await cache.invalidate(5)  # a blobnode said a unit moved: the old units are never used again
        with pytest.raises(errors.Unavailable):
            await cache.get(5)
        down = False
        assert (await cache.get(5)).vid == 5

    asyncio.run(scenario())


def test_a_moved_unit_while_clustermgr_is_away_fails_alone_and_the_volume_serves_on() -> None:
    """A blobnode says unit 0 moved while clustermgr does not answer: that call fails as the blobnode said, soon,
    and the volume's other units are still served from the entry held (a degraded read needs them); once
    clustermgr answers, the call is retried on the unit where it now is."""
    units = [Unit(vuid=10 + i, disk_id=1 + i, host=f"http://bn{i}") for i in range(2)]
    moved_to = Unit(vuid=20, disk_id=9, host="http://bn9")
    volume = VolumeView(vid=5, code_mode=11, backend="isal", units=units, capacity=100)
    down = False

    async def handler(request: Request) -> FakeReply:
        if down:
            raise errors.Unreachable("connection refused")
        return FakeReply.of(volume)

    async def call(unit: Unit) -> str:
        if unit.disk_id == 1:
            raise errors.StaleEpoch(f"unit {unit.vuid} moved")
        return unit.host

    async def scenario() -> None:
        nonlocal down, volume
        http, transport = fake(handler)
        cache = VolumeCache(ClusterClient(HOSTS, http=http, deadline=5.0), ttl=60)
        assert await cache.on_unit(5, 1, call) == "http://bn1"
        down = True
        started = time.monotonic()
        with pytest.raises(errors.StaleEpoch):
            await cache.on_unit(5, 0, call)
        assert time.monotonic() - started < 3.0  # not clustermgr's whole deadline
        asked = len(transport.requests)
        assert await cache.on_unit(5, 1, call) == "http://bn1"
        assert len(transport.requests) == asked  # served from the entry held
        down = False
        volume = volume.model_copy(update={"units": [moved_to, units[1]]})
        assert await cache.on_unit(5, 0, call) == "http://bn9"

    asyncio.run(scenario())
