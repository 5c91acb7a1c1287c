"""blobstore_server.libs.raft with real kvserver processes on 127.0.0.1: crashes, quorum loss, restarts,
wiped nodes and membership changes. Every process is killed by PID at teardown."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from tests.support.raftkv.kvclient import KVClient, KVError
from tests.support.raftkv.kvcluster import LocalCluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path, 3, snapshot_threshold=1000, snapshot_keep=200, checksum_interval=100)
    try:
        c.start_all()
        yield c
    finally:
        c.close()


class Writers:
    """Clients writing unique keys until stopped; records what was acknowledged."""

    running: list[Writers] = []

    def __init__(self, client: KVClient, n: int = 8, prefix: str = "w") -> None:
        self.client, self.prefix = client, prefix
        self.acked: list[bytes] = []
        self.ack_times: list[tuple[float, float]] = []  # (issued, acknowledged)
        self._ids = itertools.count()
        self._stop = False
        self.tasks = [asyncio.get_running_loop().create_task(self._run()) for _ in range(n)]
        Writers.running.append(self)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop:
            key = f"{self.prefix}{next(self._ids)}".encode()
            issued = loop.time()
            try:
                await self.client.put(key, key)
            except KVError:
                continue
            self.acked.append(key)
            self.ack_times.append((issued, loop.time()))

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self.tasks)
        if self in Writers.running:
            Writers.running.remove(self)


def run(cluster: LocalCluster, body: Callable[[], Awaitable[None]]) -> None:
    """Run an async test body; clients and writers are closed even when it fails."""

    async def main() -> None:
        try:
            await body()
        finally:
            for w in Writers.running:
                await w.stop()
            await cluster.close_clients()

    asyncio.run(main())


async def _missing(client: KVClient, keys: list[bytes]) -> list[bytes]:
    values = []
    for i in range(0, len(keys), 200):
        values += await asyncio.gather(*(client.get(k) for k in keys[i:i + 200]))
    return [k for k, v in zip(keys, values, strict=True) if v != k]


def test_kill_leader_under_writes_loses_nothing(cluster: LocalCluster) -> None:
    async def main() -> None:
        client = cluster.client(timeout=10)
        old = await cluster.wait_leader(client)
        writers = Writers(cluster.client(timeout=10))
        await eventually(lambda: (len(writers.acked) > 300), 10, "writes before the kill")
        loop = asyncio.get_running_loop()
        cluster.kill(old)
        killed_at = loop.time()
        before = len(writers.acked)
        await eventually(lambda: (len(writers.acked) > before + 100), 10, "writes after the kill")
        await writers.stop()
        first_after = min(done for issued, done in writers.ack_times if issued > killed_at)
        assert first_after - killed_at < 2.0, f"no write acknowledged for {first_after - killed_at:.2f}s"
        live = [i for i in cluster.initial if i != old]
        await cluster.wait_converged(client, live)
        assert await _missing(client, writers.acked) == []
        cluster.start(old)
        await cluster.wait_converged(client, list(cluster.initial))

    run(cluster, main)


def test_writes_refused_without_quorum_until_a_node_returns(cluster: LocalCluster) -> None:
    async def main() -> None:
        client = cluster.client(timeout=10)
        lead = await cluster.wait_leader(client)
        await client.put(b"before", b"1")
        followers = [i for i in cluster.initial if i != lead]
        for i in followers:
            cluster.stop(i)
        short = cluster.client(timeout=1.5, attempt_timeout=0.5)
        for n in range(3):
            with pytest.raises(KVError):
                await short.put(f"refused{n}".encode(), b"x")
        cluster.start(followers[0])
        await client.put(b"after", b"2")
        assert await client.get(b"before") == b"1"
        assert await client.get(b"after") == b"2"

    run(cluster, main)


def test_restart_all_keeps_state(cluster: LocalCluster) -> None:
    async def main() -> None:
        client = cluster.client(timeout=10)
        await cluster.wait_leader(client)
        keys = [f"r{i}".encode() for i in range(1500)]  # crosses a snapshot (threshold 1000)
        for i in range(0, len(keys), 100):
            await asyncio.gather(*(client.put(k, k) for k in keys[i:i + 100]))
        await client.delete(keys[0])
        before = await cluster.wait_converged(client, list(cluster.initial))
        for i in cluster.initial:
            cluster.kill(i)
        cluster.start_all()
        await cluster.wait_leader(client)
        after = await cluster.wait_converged(client, list(cluster.initial))
        assert {c["checksum"] for c in after.values()} == {c["checksum"] for c in before.values()}
        assert await _missing(client, keys[1:]) == []
        assert await client.get(keys[0]) is None

    run(cluster, main)


def test_wiped_node_catches_up_from_snapshot_and_log(cluster: LocalCluster) -> None:
    async def main() -> None:
        client = cluster.client(timeout=10)
        lead = await cluster.wait_leader(client)
        victim = next(i for i in cluster.initial if i != lead)
        keys = [f"s{i}".encode() for i in range(3000)]
        for i in range(0, len(keys), 200):
            await asyncio.gather(*(client.put(k, k) for k in keys[i:i + 200]))
        cluster.kill(victim)
        cluster.wipe(victim)
        cluster.start(victim)
        sums = await cluster.wait_converged(client, list(cluster.initial), timeout=30)
        assert sums[victim]["applied"] >= len(keys)
        status = await client.status(victim)
        assert status["snapshot_index"] > 0  # it was installed from a snapshot

    run(cluster, main)


def test_add_learner_promote_remove_under_writes(cluster: LocalCluster) -> None:
    async def main() -> None:
        client = cluster.client(timeout=10)
        lead = await cluster.wait_leader(client)
        writers = Writers(cluster.client(timeout=10), n=4)
        new = cluster.add_node()
        cluster.start(new, join=True)
        await client.add_learner(new, cluster.peer_addr[new])
        await eventually(lambda: _caught_up(client, new, lead), 20, "the learner to catch up")
        await client.promote(new)
        old = next(i for i in cluster.initial if i != lead)
        await client.remove(old)
        cluster.stop(old)
        before = len(writers.acked)
        await eventually(lambda: (len(writers.acked) > before + 100), 10, "writes after the change")
        await writers.stop()
        members = [i for i in (*cluster.initial, new) if i != old]
        await cluster.wait_converged(client, members)
        status = await client.status(lead)
        assert {int(k): v["voter"] for k, v in status["members"].items()} == {i: True for i in members}
        assert await _missing(client, writers.acked) == []

    run(cluster, main)


async def _caught_up(client: KVClient, node: int, leader: int) -> bool:
    mine, theirs = await client.try_status(node), await client.try_status(leader)
    return bool(mine and theirs and theirs["commit"] - mine["applied"] < 100)
