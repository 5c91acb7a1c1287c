"""clustermgr under a paused leader and lost replies, produced for real: SIGSTOP of the leader process
(a long GC, a stalled disk, a cut that leaves it alive), kill -9 and restart of every replica, a wiped
replica caught up by snapshot, and the `fault_hooks` switch cutting replies after their command
committed. Clients ride out the pause, and every retried command applies exactly once; a volume creation whose
outcome the leader never learned keeps its chunks."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import BaseModel

from blobstore_server.libs.proto.clustermgr import (
    POLICY_KEY,
    ROUTES,
    SESSION_HEADER,
    CodeModePolicy,
    CodeModeRule,
    DropReplies,
    KeyCas,
    KeyValue,
    LeaderView,
    MaybeValue,
    ScopeAlloc,
    ScopeRange,
    VolumeView,
)
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc import errors
from blobstore_server.libs.rpc.client import AiohttpTransport, HttpClient, Request, Response
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.clustermgr.volumes import INTENT_PREFIX, VolumeIntent
from tests.support.load import wait_for_put
from tests.support.processes import LocalCluster, Service
from tests.support.waiting import eventually

ClusterMgrFactory = Callable[..., list[Service]]
ClusterFactory = Callable[..., LocalCluster]
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
QUIET = {"code_modes": [{"code_mode": "EC3P3", "min_volumes": 0}]}  # no volumes: metadata only


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def leader_of(c: ClusterClient, cms: list[Service]) -> Service:
    """The replica that says it leads the newest term (each asked directly)."""
    for _ in range(200):
        views = []
        for cm in cms:
            try:
                views.append((await c.http.call("GET", f"{cm.url}/raft/leader", LeaderView, timeout=0.5), cm))
            except errors.Unavailable:
                continue
        leaders = [(view.term, cm) for view, cm in views if view.role == "leader"]
        if leaders:
            return max(leaders, key=lambda lead: lead[0])[1]
        await asyncio.sleep(0.05)
    raise AssertionError("no leader")


async def send(c: ClusterClient, url: str, path: str, body: BaseModel, response: type[M], session: str) -> M:
    """A write with a session given by hand ("client seq acked"): a retry from a client that waited."""
    return await c.http.call("POST", f"{url}{path}", response, body=body, headers={SESSION_HEADER: session})


def pause(cm: Service) -> None:
    os.kill(cm.pid, signal.SIGSTOP)


def resume(cm: Service) -> None:
    os.kill(cm.pid, signal.SIGCONT)


def test_writes_ride_out_a_paused_leader_and_apply_exactly_once(clustermgr_factory: ClusterMgrFactory) -> None:
    """Several clients write (set, CAS, scope alloc) while the leader is stopped for 5 s: no write waits
    more than 2 s, nothing acknowledged is lost, no CAS is told it lost a race it won, no range is wasted."""
    cms = clustermgr_factory(**QUIET)
    waits: list[float] = []
    acked: dict[str, str] = {}
    counters: dict[str, int] = {}
    ranges: list[tuple[int, int]] = []
    stop = asyncio.Event()

    async def timed(write: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            return await write
        finally:
            waits.append(time.monotonic() - started)

    async def writer(c: ClusterClient, name: str) -> None:
        counters[name] = 0
        await c.kv_set(f"count/{name}", "0")
        i = 0
        while not stop.is_set():
            i += 1
            await timed(c.kv_set(f"w/{name}/{i}", str(i)))
            acked[f"w/{name}/{i}"] = str(i)
            # The only writer of its counter: a Conflict here would be a retried CAS that had won.
            await timed(c.kv_cas(f"count/{name}", str(counters[name]), str(counters[name] + 1)))
            counters[name] += 1
            got = await timed(c.alloc_scope("bid", 10))
            ranges.append((got.start, got.end))

    async def scenario() -> None:
        clients = [ClusterClient([cm.url for cm in cms]) for _ in range(4)]
        try:
            leader = await leader_of(clients[0], cms)
            tasks = [asyncio.create_task(writer(c, f"c{i}-{j}")) for i, c in enumerate(clients) for j in range(2)]
            while len(ranges) < 40:
                await asyncio.sleep(0.05)
            pause(leader)
            try:
                await asyncio.sleep(5.0)
                during = len(ranges)
            finally:
                resume(leader)
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*tasks)
            assert during > 40 + 20, "writes went on while the leader was stopped"
            assert max(waits) < 2.0, sorted(waits)[-5:]
            check = clients[0]
            assert await check.kv_list("w/") == acked
            for name, value in counters.items():
                assert await check.kv_get(f"count/{name}") == str(value)
            spans = sorted(ranges)
            assert spans[0][0] == 1 and all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans))
        finally:
            for c in clients:
                await c.close()

    run(scenario())


class CountingTransport(AiohttpTransport):
    """The real transport, counting the requests sent per path (to see the retries a client made)."""

    def __init__(self) -> None:
        super().__init__(timeout=10)
        self.sent: Counter[str] = Counter()

    def send(self, request: Request) -> AbstractAsyncContextManager[Response]:
        self.sent[urlsplit(request.url).path] += 1
        return super().send(request)


async def drop_next_reply(c: ClusterClient, cms: list[Service], path: str) -> None:
    for cm in cms:
        await c.http.call("POST", f"{cm.url}/fault/drop_reply", DropReplies, body=DropReplies(path=path, count=1))


def test_a_reply_lost_after_commit_gets_the_first_answer_on_retry(clustermgr_factory: ClusterMgrFactory) -> None:
    cms = clustermgr_factory(fault_hooks=True, **QUIET)

    async def scenario() -> None:
        transport = CountingTransport()
        # an HttpClient given to a client signs for the routes it is given: clustermgr's
        async with ClusterClient([cm.url for cm in cms], http=HttpClient(transport, routes=ROUTES)) as c:
            await c.kv_set("warm", "up")
            await drop_next_reply(c, cms, "/kv/cas")
            await c.kv_cas("lock", None, "me")  # won, the reply lost, retried: still won, not a Conflict
            assert await c.kv_get("lock") == "me" and transport.sent["/kv/cas"] == 2
            await drop_next_reply(c, cms, "/scope/alloc")
            first = await c.alloc_scope("bid", 100)
            second = await c.alloc_scope("bid", 100)
            assert (first.start, second.start) == (1, 101) and transport.sent["/scope/alloc"] == 3  # nothing wasted

            # Without a session (curl) the same loss is a retry applied twice: what sessions prevent.
            leader = (await leader_of(c, cms)).url
            await drop_next_reply(c, cms, "/kv/cas")
            cas = KeyCas(key="curl", expected=None, value="x")
            with pytest.raises(errors.Unavailable):
                await c.http.call("POST", f"{leader}/kv/cas", MaybeValue, body=cas)
            with pytest.raises(errors.Conflict):
                await c.http.call("POST", f"{leader}/kv/cas", MaybeValue, body=cas)

    run(scenario())


def test_sessions_survive_a_restart_and_a_snapshot_install(clustermgr_factory: ClusterMgrFactory) -> None:
    cms = clustermgr_factory(snapshot_threshold=50, snapshot_keep=5, **QUIET)
    alloc, cas = ScopeAlloc(name="bid", count=7), KeyCas(key="lock", expected=None, value="mine")

    async def retries_answered(c: ClusterClient, url: str) -> tuple[ScopeRange, MaybeValue]:
        return (await send(c, url, "/scope/alloc", alloc, ScopeRange, "patient 1 0"),
                await send(c, url, "/kv/cas", cas, MaybeValue, "patient 2 0"))

    async def scenario() -> None:
        async with ClusterClient([cm.url for cm in cms]) as c:
            first = await retries_answered(c, (await leader_of(c, cms)).url)
            for cm in cms:  # every replica at once, with no chance to flush: the table is rebuilt from the log
                cm.kill9()
            for cm in cms:
                cm.start()
            assert await retries_answered(c, (await leader_of(c, cms)).url) == first

            # A replica wiped and caught up by snapshot: the log it would need is compacted away.
            leader = await leader_of(c, cms)
            wiped = next(cm for cm in cms if cm is not leader)
            wiped.stop()
            shutil.rmtree(wiped.config["data_dir"])
            wiped.config["election_timeout_ms"] = [100, 150]  # so that it wins the elections below
            for i in range(120):
                await c.kv_set(f"fill/{i}", "x")
            target = (await c.raft_status()).commit
            wiped.start()
            await eventually(lambda: _caught_up_by_snapshot(c, wiped.url, target), 20, "a snapshot install")
            for _ in range(10):  # stop whoever leads until the wiped replica is elected
                leader = await leader_of(c, cms)
                if leader is wiped:
                    break
                pause(leader)
                try:
                    await leader_of(c, [cm for cm in cms if cm is not leader])
                finally:
                    resume(leader)
            assert await retries_answered(c, wiped.url) == first
            assert (await c.raft_status(wiped.url)).role == "leader"

    run(scenario())


async def _caught_up_by_snapshot(c: ClusterClient, url: str, target: int) -> bool:
    status = await c.raft_status(url)
    return status.snapshot_index > 0 and status.applied_index >= target


def test_the_session_table_stays_bounded_under_many_short_lived_clients(
        clustermgr_factory: ClusterMgrFactory) -> None:
    cms = clustermgr_factory(session_limit=20, session_ttl=3.0, **QUIET)

    async def scenario() -> None:
        async with ClusterClient([cm.url for cm in cms]) as c:
            leader = (await leader_of(c, cms)).url
            for i in range(60):
                async with ClusterClient([leader]) as once:  # a CLI run, a restarted service
                    await once.kv_set(f"once/{i}", "x")
                if i % 10 == 9:  # a long-lived client keeps writing meanwhile
                    await send(c, leader, "/kv/set", KeyValue(key="steady", value=str(i)), KeyValue,
                               f"steady {i} {i - 1}")
            assert (await c.stat()).sessions == 20
            # The steady client's last write is still known: its retry gets the first answer.
            retry = await send(c, leader, "/kv/set", KeyValue(key="steady", value="again"), KeyValue, "steady 59 58")
            assert retry.value == "59" and await c.kv_get("steady") == "59"
            await asyncio.sleep(4.5)  # every session idles past the ttl (counted in whole seconds of the leader)
            await c.kv_set("late", "1")
            await c.kv_set("late", "2")  # each command drops a bounded number of idle sessions
            assert (await c.stat()).sessions == 1

    run(scenario())


def test_puts_ride_out_a_paused_clustermgr_leader(cluster_factory: ClusterFactory) -> None:
    """The data path needs clustermgr only through the allocator's leases and prefetched bids: a
    leader stopped for 5 s fails no PUT."""
    cluster = cluster_factory()
    acked: dict[str, bytes] = {}
    failed: list[str] = []
    stop = threading.Event()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
            while not stop.is_set():
                data = rng.randbytes(rng.randrange(1, 100_000))
                resp = client.put("/blob", content=data)
                if resp.status_code == 200:
                    acked[resp.json()["location"]] = data
                else:
                    failed.append(resp.text)

    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
    threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    try:
        async def find_leader() -> Service:
            async with ClusterClient([cm.url for cm in cluster.clustermgr]) as c:
                return await leader_of(c, cluster.clustermgr)

        leader = asyncio.run(find_leader())
        pause(leader)
        try:
            before = len(acked)
            threading.Event().wait(5.0)
            during = len(acked) - before
        finally:
            resume(leader)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failed == [] and during > 10
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        for token, data in acked.items():
            assert client.get(f"/blob/{token}").content == data


def test_a_volume_whose_creation_answer_was_lost_keeps_its_chunks(cluster_factory: ClusterFactory) -> None:
    """The leader proposes a volume to followers that are stopped (their sockets still take its bytes), steps down
    for want of a quorum and learns only "the outcome is unknown"; once the followers run again they hold the entry
    and the next leader commits it. The leader that lost its answer must release nothing: the volume keeps every
    chunk, takes a PUT, reads it back, and no intent is left behind.

    A blobnode stopped while the leader creates the chunks holds the leader between the intent and the proposal,
    so the followers are stopped before the volume is proposed. Slow elections (1.5-2.5 s) give the leader that
    long to propose before it steps down."""
    cluster = cluster_factory(min_volumes=0, clustermgr={"election_timeout_ms": [1500, 2500]})
    cms, stalled = cluster.clustermgr, cluster.blobnodes[0]
    one_volume = CodeModePolicy.dump([CodeModeRule(code_mode="EC3P3", min_volumes=1, min_idle_volumes=0)])

    async def scenario() -> VolumeView:
        async with ClusterClient([cm.url for cm in cms]) as c:
            leader = await leader_of(c, cms)
            followers = [cm for cm in cms if cm is not leader]
            pause(stalled)
            try:
                await c.set_config(POLICY_KEY, one_volume)
                intents = await eventually(lambda: c.kv_list(INTENT_PREFIX), 10, "the creation's intent")
                for follower in followers:
                    pause(follower)
            finally:
                resume(stalled)
            try:
                await eventually(lambda: _logged(leader, "volume_create: not committed"), 15,
                                 "the leader to lose the answer to its volume_create")
            finally:
                for follower in followers:
                    resume(follower)
            vid = VolumeIntent.model_validate_json(next(iter(intents.values()))).vid
            volume = await eventually(lambda: _volume_if_created(c, vid), 20, f"volume {vid} committed")
            assert volume is not None
            await eventually(lambda: _no_intent(c), 20, "the intent finished")
            async with BlobnodeClient() as blobnodes:
                for unit in volume.units:
                    assert (await blobnodes.chunk_stat(unit.host, unit.disk_id, unit.vuid)).status == "normal"
            return volume

    volume = asyncio.run(scenario())
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, b"into the volume whose answer was lost")
        assert Location.from_token(token, LocalCluster.secret.encode()).blobs[0].vid == volume.vid
        assert client.get(f"/blob/{token}").content == b"into the volume whose answer was lost"


async def _logged(service: Service, text: str) -> bool:
    return text in service.log_path.read_text()


async def _volume_if_created(c: ClusterClient, vid: int) -> VolumeView | None:
    return next((v for v in await c.list_volumes() if v.vid == vid), None)


async def _no_intent(c: ClusterClient) -> bool:
    return not await c.kv_list(INTENT_PREFIX)
