"""Policy above the service clients, over the fake transport (`libs.rpc.testing`): which host is asked,
what is retried, and what an answer becomes. Real processes test the same clients end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from libs.proto.allocator import AllocResult, BlobSlice
from libs.proto.clustermgr import MaybeValue, ScopeRange
from libs.rpc import errors
from libs.rpc.client import HttpClient, Request
from libs.rpc.testing import FakeReply, FakeTransport
from services.allocator.client import AllocatorClient
from services.clustermgr.client import ClusterClient

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


def test_the_cluster_client_skips_an_unreachable_replica() -> None:
    async def handler(request: Request) -> FakeReply:
        if host_of(request) == "http://cm1":
            raise errors.Unavailable("connection refused")
        return FakeReply.of(MaybeValue(key="k", value="v"))

    http, transport = fake(handler)
    assert asyncio.run(ClusterClient(HOSTS, http=http).kv_get("k")) == "v"
    assert [host_of(r) for r in transport.requests] == ["http://cm1", "http://cm2"]


def test_the_cluster_client_gives_up_after_its_deadline_naming_the_last_failure() -> None:
    async def handler(request: Request) -> FakeReply:
        raise errors.Unavailable(f"{host_of(request)} is down")

    http, transport = fake(handler)
    with pytest.raises(errors.Unavailable, match=r"no leader answered within 0.3s: .* is down"):
        asyncio.run(ClusterClient(HOSTS, http=http, deadline=0.3).kv_get("k"))
    assert {host_of(r) for r in transport.requests} == set(HOSTS)


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
    for _ in range(5):
        assert asyncio.run(client.alloc(1, 100, 4096)) == [BlobSlice(vid=3, min_bid=7, count=2)]
    assert {host_of(r) for r in transport.requests} == {"http://a1", "http://a2"}

    async def all_down(request: Request) -> FakeReply:
        raise errors.Unavailable("down")

    with pytest.raises(errors.Unavailable, match="no allocator could allocate"):
        asyncio.run(AllocatorClient(["http://a1", "http://a2"], http=fake(all_down)[0]).alloc(1, 100, 4096))
