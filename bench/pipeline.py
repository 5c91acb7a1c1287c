"""Repair and delete throughput through Kafka, next to the raw Kafka produce/consume rate of the same
message count in the same run.

Brings a cluster up with the launcher (Kafka, mqproxy, tinker, worker, two allocators, two access nodes; EC3P3;
delete safe delay 0), stores `--blobs` objects of `--size` bytes through the SDK given every access node, then:
  repair: drops shard 0 of every blob on its blobnode, queues one repair message per blob through
          mqproxy and times until tinker reports them all done (shards/s, MB/s rebuilt);
  delete: DELETEs every object through the access nodes and times until tinker's delete log holds them all
          (blobs/s reclaimed);
  raw:    produces the same number of messages with libs/mq and consumes them in a fresh group.
Writes JSON and prints one summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blobstore import AsyncClient
from blobstore_server.cluster import launcher
from blobstore_server.cluster.kafka_auth import ADMIN, kafka_user
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.libs.mq.consumer import Consumer
from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.proto.mqproxy import RepairIn
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.mqproxy.client import MqProxyClient
from blobstore_server.services.tinker.client import TinkerClient
from tests.support.damage import lose_shard


def url_of(info: launcher.ClusterInfo, role: str) -> str:
    return next(p.url for p in info.processes if p.role == role)


async def store(access: list[str], count: int, size: int) -> list[str]:
    data = os.urandom(size)
    async with AsyncClient(access, timeout=60) as client:
        sem = asyncio.Semaphore(8)

        async def one() -> str:
            async with sem:
                return await client.put(data)

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def wait_for(check: object, timeout: float) -> float:
    start = time.perf_counter()
    while not await check():  # type: ignore[operator]
        if time.perf_counter() - start > timeout:
            raise TimeoutError("the pipeline did not finish in time")
        await asyncio.sleep(0.05)
    return time.perf_counter() - start


async def bench_repair(info: launcher.ClusterInfo, blobs: list[tuple[int, int]]) -> dict[str, float]:
    tinker, mqproxy = url_of(info, "tinker"), url_of(info, "mqproxy")
    async with ClusterClient(info.clustermgr_urls) as cm, BlobnodeClient() as bn, TinkerClient() as stats, \
            MqProxyClient([mqproxy]) as queue:
        shard_size = 0
        for vid, bid in blobs:
            unit = (await cm.get_volume(vid)).units[0]
            shard_size = (await bn.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)).size
            await lose_shard(bn, unit, bid)  # rotted, then discarded as a repair does: owed a repair
        before = (await stats.stats(tinker)).pipelines["repair"].done
        start = time.perf_counter()
        await queue.send_repair([RepairIn(vid=vid, bid=bid, bad_indexes=[0], reason="bench") for vid, bid in blobs])

        async def done() -> bool:
            return (await stats.stats(tinker)).pipelines["repair"].done - before >= len(blobs)

        await wait_for(done, 600)
        elapsed = time.perf_counter() - start
    return {"shards_per_s": round(len(blobs) / elapsed, 1),
            "mb_per_s": round(len(blobs) * shard_size / elapsed / 1e6, 2), "seconds": round(elapsed, 2)}


async def bench_delete(info: launcher.ClusterInfo, tokens: list[str]) -> dict[str, float]:
    log = Path(info.dir) / "tinker" / "deletes.jsonl"
    already = len(log.read_text().splitlines()) if log.exists() else 0
    start = time.perf_counter()
    async with AsyncClient(info.access_urls, timeout=60) as client:
        sem = asyncio.Semaphore(8)

        async def one(token: str) -> None:
            async with sem:
                await client.delete(token)

        await asyncio.gather(*(one(t) for t in tokens))

    async def done() -> bool:
        return log.exists() and len(log.read_text().splitlines()) - already >= len(tokens)

    await wait_for(done, 600)
    elapsed = time.perf_counter() - start
    return {"blobs_per_s": round(len(tokens) / elapsed, 1), "seconds": round(elapsed, 2)}


async def bench_raw_kafka(bootstrap: str, count: int, login: dict[str, Any]) -> dict[str, float]:
    """`login`: the librdkafka settings of a Kafka user allowed to write and read (the admin's)."""
    topic = "shard_repair"  # an existing topic; a fresh group reads only what it is told to count
    producer = await Producer.connect(bootstrap, **login)
    start = time.perf_counter()
    sent = await asyncio.gather(*(producer.send(topic, b"k%d" % i, b'{"bench": %d}' % i) for i in range(count)))
    produce = time.perf_counter() - start
    await producer.close()
    first = {p: o for p, o in sorted(sent, reverse=True)}  # lowest offset we wrote, per partition
    consumer = await Consumer.connect(bootstrap, f"bench-{uuid.uuid4().hex[:8]}", [topic], **login)
    got, start = 0, time.perf_counter()
    while got < count:
        got += sum(1 for r in await consumer.poll(timeout=0.5) if r.offset >= first.get(r.partition, 1 << 62))
    consume = time.perf_counter() - start
    await consumer.close()
    return {"produce_per_s": round(count / produce, 1), "consume_per_s": round(count / consume, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blobs", type=int, default=300)
    parser.add_argument("--size", type=int, default=64 << 10)
    parser.add_argument("--out", default="bench/results/pipeline.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        root = Path(tmp) / "cluster"
        info = launcher.up(root, ClusterShape(delete_delay=0.0))
        launcher.sign_as_operator(root)
        try:
            # every access node signs Locations with the same secret: access1's will do
            secret = json.loads(next(Path(p.config).read_text() for p in info.processes if p.name == "access1"))
            key = secret["secret"].encode()
            tokens = asyncio.run(store(info.access_urls, args.blobs, args.size))
            blobs = [next(Location.from_token(t, key).blob_ids()) for t in tokens]
            repair = asyncio.run(bench_repair(info, blobs))
            delete = asyncio.run(bench_delete(info, tokens))
            admin = kafka_user((root / launcher.SECRET_FILE).read_text().strip(), ADMIN, launcher.cluster_ca(root))
            raw = asyncio.run(bench_raw_kafka(info.kafka_bootstrap, args.blobs, client_auth(admin)))
        finally:
            launcher.down(root)
    result = {"blobs": args.blobs, "size": args.size, "repair": repair, "delete": delete, "raw_kafka": raw}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"pipeline ({args.blobs} x {args.size} B, EC3P3): repair {repair['shards_per_s']} shards/s "
          f"({repair['mb_per_s']} MB/s rebuilt), delete {delete['blobs_per_s']} blobs/s; "
          f"raw Kafka produce {raw['produce_per_s']}/s consume {raw['consume_per_s']}/s")


if __name__ == "__main__":
    main()
