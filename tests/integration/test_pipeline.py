"""Kafka-driven repair and delete, end to end: real broker, mqproxy, tinker, worker, access, blobnodes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.settings import KafkaAuth, client_auth
from blobstore_server.libs.mq.topics import Topic
from blobstore_server.libs.proto.messages import DeleteMsg
from blobstore_server.libs.proto.tinker import PipelineStats, TinkerStats
from blobstore_server.libs.rpc.tickets import IntentSigner
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from tests.support import damage
from tests.support.load import wait_for_put
from tests.support.processes import SIGNED, LocalCluster, wait_until
from tests.support.shards import blobs_of, states
from tests.support.tickets import delete_intent

ClusterFactory = Callable[..., LocalCluster]


def lose_shard(cluster: LocalCluster, blobs: list[tuple[int, int]], index: int) -> None:
    """Delete shard `index` of every blob straight on its blobnode, as a lost disk sector would."""

    async def lose() -> None:
        async with ClusterClient([cm.url for cm in cluster.clustermgr]) as cm, BlobnodeClient() as bn:
            for vid, bid in blobs:
                unit = (await cm.get_volume(vid)).units[index]
                await damage.lose_shard(bn, unit, bid)

    asyncio.run(lose())


def chunk_blocks(cluster: LocalCluster) -> int:
    return sum(os.stat(p).st_blocks for node in cluster.blobnodes for p in node.workdir.glob("disk*/data/*"))


def tinker_stats(cluster: LocalCluster) -> dict[str, PipelineStats]:
    answer = httpx.get(f"{cluster.background['tinker'].url}/stats", timeout=30, auth=SIGNED)
    return TinkerStats.model_validate_json(answer.content).pipelines


def test_delete_hides_at_once_and_reclaims_space_after_the_safe_delay(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=3.0)
    data = random.Random(1).randbytes(3 << 20)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token = wait_for_put(client, data)
        (vid, bid), = blobs_of(cluster, token)
        blocks_before = chunk_blocks(cluster)
        deleted_at = time.monotonic()
        resp = client.delete(f"/blob/{token}")
        assert resp.status_code == 202 and resp.json() == {"queued_blobs": 1}
        wait_until(lambda: client.get(f"/blob/{token}").status_code == 404, 10, "GET to answer 404")
        assert time.monotonic() - deleted_at < 3.0  # hidden well before the safe delay ends
        assert states(cluster, vid, bid) == ["mark_deleted"] * 6
        wait_until(lambda: states(cluster, vid, bid) == ["missing"] * 6, 20, "every shard purged")
        assert chunk_blocks(cluster) < blocks_before - (3 << 20) // 512
        assert client.delete(f"/blob/{token}").status_code == 202  # harmless the second time
        assert client.get(f"/blob/{token}").status_code == 404
    log = Path(cluster.background["tinker"].config["delete_log"])
    wait_until(log.exists, 10, "the delete log")  # written just after the last shard is purged
    assert {(e["vid"], e["bid"]) for e in map(json.loads, log.read_text().splitlines())} == {(vid, bid)}


def test_a_put_short_of_one_node_is_repaired_when_it_returns(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        down = cluster.blobnodes[0]
        down.kill9()
        data = random.Random(2).randbytes(200_000)
        token = wait_for_put(client, data)  # quorum 5 of 6 still met
        (vid, bid), = blobs_of(cluster, token)
        assert states(cluster, vid, bid).count("present") == 5
        # While the node stays down the repair fails and is retried, not lost.
        wait_until(lambda: tinker_stats(cluster)["repair"].retried >= 2, 20, "repair retried")
        down.start()
        wait_until(lambda: states(cluster, vid, bid) == ["present"] * 6, 30, "all six shards present")
        assert client.get(f"/blob/{token}").content == data


def test_a_blob_deleted_while_its_repair_is_queued_stays_deleted(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=1.0)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        down = cluster.blobnodes[0]
        down.kill9()
        token = wait_for_put(client, b"doomed" * 1000)  # shard on the dead node: a repair is queued
        (vid, bid), = blobs_of(cluster, token)
        assert client.delete(f"/blob/{token}").status_code == 202
        wait_until(lambda: client.get(f"/blob/{token}").status_code == 404, 10, "GET to answer 404")
        down.start()  # the repair can now run; it must not bring the blob back
        wait_until(lambda: set(states(cluster, vid, bid)) == {"missing"}, 30, "every shard purged")
        wait_until(lambda: tinker_stats(cluster)["repair"].done >= 1, 30, "the queued repair carried out")
        assert set(states(cluster, vid, bid)) == {"missing"}
        assert client.get(f"/blob/{token}").status_code == 404


def test_tinkers_config_alone_deletes_nothing(cluster_factory: ClusterFactory) -> None:
    """A thief holding tinker's config (its Kafka login, which writes tinker's retry topic; the messages' seal; its
    delete-ticket key) queues deletes of a live object's blob straight into Kafka, due at once and past the safe
    delay: without an intent, with one signed by tinker's own key, and with the intent access signed for another
    object's delete (read off Kafka). Tinker works each one and every blobnode refuses its marks (tinker hands each
    on for a retry), and the object reads back whole, every shard present; the same blob's delete through access
    goes."""
    cluster = cluster_factory(pipelines=True, safe_delay=1.0)
    data = random.Random(6).randbytes(100_000)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        token, other = wait_for_put(client, data), wait_for_put(client, b"another")
        [(vid, bid)], [(other_vid, other_bid)] = blobs_of(cluster, token), blobs_of(cluster, other)
        tinker = cluster.background["tinker"].config
        tinkers_key = IntentSigner(tinker["auth"]["ticket_signing_key"], tinker["cluster_id"]).sign(vid, bid)
        access_signed = delete_intent(other_vid, other_bid).signature  # what access sent for the other's delete
        attempts = [DeleteMsg(cluster_id=tinker["cluster_id"], vid=vid, bid=bid, time=1.0, intent=intent)
                    for intent in (None, tinkers_key, access_signed)]
        retried = tinker_stats(cluster)["delete"].retried

        async def queue() -> None:
            login = KafkaAuth.model_validate(tinker["kafka_auth"]) if tinker.get("kafka_auth") else None  # the
            # tests' own broker takes none
            producer = await Producer.connect(tinker["kafka_bootstrap"], seal_key=bytes.fromhex(tinker["message_key"]),
                                              **client_auth(login))
            try:
                for msg in attempts:
                    await producer.send(Topic.BLOB_DELETE_FAILED, msg.key(), msg.to_bytes())
            finally:
                await producer.close()

        asyncio.run(queue())
        wait_until(lambda: tinker_stats(cluster)["delete"].retried >= retried + len(attempts), 30,
                   "tinker to work every forged delete and hand it on")
        time.sleep(1.0)  # past the safe delay: a mark that had gone through would be a purge by now
        assert states(cluster, vid, bid) == ["present"] * 6
        assert client.get(f"/blob/{token}").content == data
        assert client.delete(f"/blob/{token}").status_code == 202
        wait_until(lambda: states(cluster, vid, bid) == ["missing"] * 6, 30, "every shard purged")


def test_kill9_tinker_during_500_deletes_deletes_every_blob_exactly(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, safe_delay=0.0)
    tinker = cluster.background["tinker"]
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        with ThreadPoolExecutor(8) as pool:
            tokens = list(pool.map(lambda i: put_ok(client, b"%d" % i), range(500)))
            keep = put_ok(client, b"keep me")
            assert set(pool.map(lambda t: client.delete(f"/blob/{t}").status_code, tokens)) == {202}
        log = Path(tinker.config["delete_log"])
        wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 100, 60, "deletes under way")
        tinker.kill9()
        tinker.start()
        wanted = {blobs_of(cluster, t)[0] for t in tokens}
        wait_until(lambda: {(e["vid"], e["bid"]) for e in map(json.loads, log.read_text().splitlines())} >= wanted,
                   120, "every blob deleted")
        for token in random.Random(4).sample(tokens, 30):
            answer = client.get(f"/blob/{token}")
            assert answer.status_code == 404, answer.text
        assert client.get(f"/blob/{keep}").content == b"keep me"


def put_ok(client: httpx.Client, data: bytes) -> str:
    resp = client.put("/blob", content=data)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["location"])


def test_priority_repairs_overtake_a_backlog(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(pipelines=True, tinker={"concurrency": 1})
    tinker, worker = cluster.background["tinker"], cluster.background["worker"]
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        blobs = [blobs_of(cluster, put_ok(client, b"p%d" % i * 2000))[0] for i in range(31)]

    lose_shard(cluster, blobs, 1)
    *backlog, urgent = blobs
    with httpx.Client(base_url=cluster.background["mqproxy"].url, timeout=60, auth=SIGNED) as mq:
        # A first priority repair (of a blob that needs none) proves the priority consumer has joined its group.
        warm = {"vid": backlog[0][0], "bid": 0, "bad_indexes": [1], "priority": True}
        assert mq.post("/repairmsg", json={"messages": [warm]}).status_code == 200
    wait_until(lambda: tinker_stats(cluster)["repair_prior"].done >= 1, 30, "the priority group joined")
    os.kill(tinker.pid, signal.SIGSTOP)  # let both topics fill before tinker polls either
    try:
        with httpx.Client(base_url=cluster.background["mqproxy"].url, timeout=60, auth=SIGNED) as mq:
            ordinary = [{"vid": v, "bid": b, "bad_indexes": [1]} for v, b in backlog]
            assert mq.post("/repairmsg", json={"messages": ordinary}).status_code == 200
            first = {"vid": urgent[0], "bid": urgent[1], "bad_indexes": [1], "priority": True}
            assert mq.post("/repairmsg", json={"messages": [first]}).status_code == 200
    finally:
        os.kill(tinker.pid, signal.SIGCONT)
        resumed = time.time()

    def repaired() -> list[tuple[str, tuple[int, int]]]:
        """(log time, blob) of each repair the worker finished, in order."""
        found = re.findall(r"^(\S+ \S+) .* repaired blob (\d+)/(\d+)", worker.log_path.read_text(), re.M)
        return [(at, (int(v), int(b))) for at, v, b in found]

    wait_until(lambda: len(repaired()) == 31, 60, "every repair done")
    taken = re.findall(rf"^(\S+ \S+) .* priority repair of blob {urgent[0]}/{urgent[1]} ", tinker.log_path.read_text(),
                       re.M)
    assert taken, "tinker logs each priority repair it takes"
    # Kafka delivers the two topics independently, so some ordinary repairs may finish before tinker even
    # sees the priority one; from then on, only the ordinary repair in hand may go first (concurrency 1).
    done_before = sum(1 for at, _ in repaired() if at < taken[0])
    order = [blob for _, blob in repaired()]
    assert order.index(urgent) <= done_before + 1, (done_before, order)
    waited = datetime.strptime(taken[0], "%Y-%m-%d %H:%M:%S,%f").timestamp() - resumed
    assert waited < 5, f"tinker took the priority repair {waited:.1f} s after it could"


# Last in this module: after a broker restart, a consumer group that is new to the broker was seen to
# stay without partitions for over 30 s, so no test that needs a fresh group runs after it.
def test_kafka_restart_during_a_repair_stream_loses_no_message(
        cluster_factory: ClusterFactory, kafka_broker: Any) -> None:
    cluster = cluster_factory(pipelines=True)
    mqproxy = cluster.background["mqproxy"]
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
        blobs = [blobs_of(cluster, put_ok(client, b"r%d" % i * 500))[0] for i in range(40)]

    lose_shard(cluster, blobs, 2)
    acked = []
    with httpx.Client(base_url=mqproxy.url, timeout=60, auth=SIGNED) as mq:
        for i, (vid, bid) in enumerate(blobs):
            if i == 20:
                kafka_broker.restart()
            msg = {"vid": vid, "bid": bid, "bad_indexes": [2], "reason": "test"}
            deadline = time.monotonic() + 60
            while (resp := mq.post("/repairmsg", json={"messages": [msg]})).status_code != 200:
                assert time.monotonic() < deadline, resp.text
                time.sleep(0.5)
            acked.append((vid, bid))
    assert len(acked) == 40
    for vid, bid in acked:
        wait_until(lambda v=vid, b=bid: states(cluster, v, b) == ["present"] * 6, 60, f"blob {vid}/{bid} repaired")
