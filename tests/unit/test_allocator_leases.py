"""The allocator counts each lease on its own clock, from when it asked clustermgr for it, and hands out durations.

FAKE clustermgr (`libs.rpc.testing`): two hosts whose wall clocks disagree by an hour cannot be produced on one
machine, so clustermgr's answers are played here with its `lease_expiry` an hour ahead of this host's clock."""

from __future__ import annotations

import asyncio
import time

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.allocator import AllocatorStat
from blobstore_server.libs.proto.clustermgr import Retained, RetainResult, ScopeRange, VolumeList, VolumeView
from blobstore_server.libs.rpc.client import HttpClient, Request
from blobstore_server.libs.rpc.testing import FakeReply, FakeTransport
from blobstore_server.services.allocator.allocator import Allocator
from blobstore_server.services.allocator.config import AllocatorConfig
from blobstore_server.services.clustermgr.client import ClusterClient

LEASE_TTL = 10.0
MARGIN = 2.0
AHEAD = 3600.0  # clustermgr's wall clock, ahead of this host's


def skewed_clustermgr(request: Request) -> FakeReply:
    """clustermgr's answers, its times on a clock `AHEAD` seconds ahead of ours."""
    lease_expiry = time.time() + AHEAD + LEASE_TTL
    if request.url.endswith("/volume/alloc"):
        volume = VolumeView(vid=1, code_mode=CodeMode.EC3P3, backend="isal", capacity=1 << 30,
                            units=[], lease_holder="a1", lease_expiry=lease_expiry)
        return FakeReply.of(VolumeList(volumes=[volume], lease_for=LEASE_TTL))
    if request.url.endswith("/volume/retain"):
        return FakeReply.of(RetainResult(retained=[Retained(vid=1, lease_expiry=lease_expiry)], refused=[],
                                         lease_for=LEASE_TTL))
    if request.url.endswith("/scope/alloc"):
        return FakeReply.of(ScopeRange(name="bid", start=1, end=10_000))
    raise AssertionError(f"unexpected request {request.method} {request.url}")


def test_a_clustermgr_clock_an_hour_ahead_does_not_stretch_what_the_allocator_hands_out() -> None:
    async def scenario() -> tuple[float, float, AllocatorStat]:
        async def handler(request: Request) -> FakeReply:
            return skewed_clustermgr(request)

        cluster = ClusterClient(["http://cm1"], http=HttpClient(FakeTransport(handler)))
        allocator = Allocator(AllocatorConfig(clustermgr_hosts=["http://cm1"], insecure=True, lease_margin=MARGIN,
                                              code_modes=["EC3P3"]), cluster)
        leased = (await allocator.allocate(CodeMode.EC3P3, 100, 4 << 20))[0].usable_for
        await asyncio.sleep(0.2)
        await allocator.retain()
        renewed = (await allocator.allocate(CodeMode.EC3P3, 100, 4 << 20))[0].usable_for
        return leased, renewed, allocator.stat()

    leased, renewed, stat = asyncio.run(scenario())
    # At most the lease clustermgr gave (10 s from when it granted it, after we asked), less the margin.
    assert LEASE_TTL - MARGIN - 1.0 < leased <= LEASE_TTL - MARGIN
    assert LEASE_TTL - MARGIN - 1.0 < renewed <= LEASE_TTL - MARGIN
    assert LEASE_TTL - 1.0 < stat.volumes[0].lease_until - stat.now <= LEASE_TTL
