"""`--deep`: executors read every shard of each readable blob and check its bytes.

The blobnode verifies each 64 KiB block's CRC as it reads, so a flipped byte comes back as `ShardCorrupted`
(a corrupt_shards finding). When more than n shards of a stripe read, the blob is rebuilt from n of them and
encoded again: every shard read must equal its re-encoded self (parity_mismatch: some shard holds
valid-CRC bytes of something else). A shard that cannot be read (its node is down, it moved) is an
unread_shards finding: it was not verified.

Reads are background I/O on the blobnodes (their per-disk cap applies), and each executor task keeps under
`rate` bytes per second. Executors sign with a read grant (libs/rpc/auth.py) that travels inside the job's
tasks, never in Spark's configuration; a blobnode refusing it fails the job (`ReadRefused`), since a refused
read says nothing about the shard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from functools import partial

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from blobstore_server.libs.ec import codec_for, parse_code_mode
from blobstore_server.libs.proto.blobnode import IOClass, ShardState, shard_state
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc import client as rpc_client
from blobstore_server.libs.rpc.auth import Grant, Signer
from blobstore_server.libs.rpc.errors import Forbidden, Unauthorized
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.spark.rules import FINDING_DDL, BlobState, Finding

REFUSED = "blobstore: shard reads refused"  # how the driver tells a refused read from any other job failure


class ReadRefused(Exception):
    """A blobnode refused an executor's read (401/403): the job must fail, not report the shard as fine."""

    def __init__(self, host: str, why: Exception) -> None:
        super().__init__(f"{REFUSED}: {host} answered {type(why).__name__}: {why}")


def refusal(error: BaseException) -> str | None:
    """The refusal line carried by a failed Spark job (the executors' exception text), if it was one."""
    text = str(error)
    start = text.find(REFUSED)
    return None if start < 0 else text[start:].splitlines()[0]


class Pacer:
    """Keeps a stream of reads under `rate` bytes per second (sleeps the caller when ahead)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.done = 0

    def delay(self, nbytes: int, now: float) -> float:
        """Seconds to wait before the next read, after `nbytes` more were read at `now`."""
        self.done += nbytes
        return max(0.0, self.start + self.done / self.rate - now)


async def _check_blob(client: BlobnodeClient, blob: Row, pacer: Pacer) -> list[tuple[object, ...]]:
    shards = sorted(blob["shards"], key=lambda s: s["unit_index"])
    reads = await asyncio.gather(*(client.get_shard(s["host"], s["disk_id"],
                                                    Vuid.make(blob["vid"], s["unit_index"], s["epoch"]), blob["bid"],
                                                    io_class=IOClass.BACKGROUND)
                                   for s in shards), return_exceptions=True)
    for shard, outcome in zip(shards, reads, strict=True):
        if isinstance(outcome, Unauthorized | Forbidden):
            raise ReadRefused(shard["host"], outcome)
    await asyncio.sleep(pacer.delay(sum(len(r) for r in reads if isinstance(r, bytes | memoryview)), time.monotonic()))
    found: list[tuple[object, ...]] = []
    for shard, outcome in zip(shards, reads, strict=True):
        state = shard_state(outcome)
        if state is not ShardState.PRESENT:
            kind = Finding.CORRUPT_SHARDS if state is ShardState.CORRUPT else Finding.UNREAD_SHARDS
            found.append((kind.value, blob["vid"], blob["bid"], shard["unit_index"], shard["disk_id"],
                          shard["host"], blob["code_mode"], shard["size"], f"{state.value}: {outcome!s}"))
    codec = codec_for(parse_code_mode(blob["code_mode"]), blob["backend"])
    by_index: list[bytes | memoryview | None] = [None] * codec.tactic.total
    for shard, outcome in zip(shards, reads, strict=True):
        if isinstance(outcome, bytes | memoryview):
            by_index[shard["unit_index"]] = outcome
    readable = [data for data in by_index if data is not None]
    if any(f[0] == Finding.CORRUPT_SHARDS.value for f in found) or len(readable) <= codec.tactic.n \
            or len({len(d) for d in readable}) != 1:
        return found  # nothing to cross-check beyond what the CRCs said
    # Rebuild the data from n shards, encode it again: every shard read must equal its re-encoded self.
    n, size = codec.tactic.n, len(readable[0])
    expected = codec.encode(codec.decode(by_index, n * size))
    bad = [i for i, data in enumerate(by_index) if data is not None and bytes(expected[i]) != data]
    if bad:
        found.append((Finding.PARITY_MISMATCH.value, blob["vid"], blob["bid"], None, None, None, blob["code_mode"],
                      n * size, f"shards {bad} disagree with the stripe re-encoded from its shards"))
    return found


def check_partition(rate: float, grant: Grant | None, ca: str | None,
                    blobs: Iterable[Row]) -> Iterator[tuple[object, ...]]:
    """Runs in an executor: one client and one event loop per partition, signing with `grant` (None: the
    cluster does not sign), https blobnodes checked against the CA certificate `ca` (PEM text)."""
    auth.install(Signer.from_grant(grant) if grant is not None else None)
    rpc_client.trust(None, ca)

    async def run() -> list[tuple[object, ...]]:
        pacer = Pacer(rate)
        out: list[tuple[object, ...]] = []
        async with BlobnodeClient() as client:
            for blob in blobs:
                out.extend(await _check_blob(client, blob, pacer))
        return out

    yield from asyncio.run(run())


def deep_findings(blobs: DataFrame, current: DataFrame, rate: float, grant: Grant | None,
                  ca: str | None = None) -> DataFrame:
    """Findings of reading the shards of every blob that has at least n shards and is not being deleted;
    `grant` signs the executors' reads, `ca` (the cluster CA's PEM) checks https blobnodes."""
    readable = blobs.filter(F.col("state").isin(BlobState.HEALTHY.value, BlobState.MISSING.value))
    shard = F.struct("unit_index", "epoch", "disk_id", "host", "size")
    keys = readable.select("vid", "bid", "code_mode", "backend")
    rows = (current.filter(~F.col("deleted")).join(keys, ["vid", "bid"])
            .groupBy("vid", "bid", "code_mode", "backend").agg(F.collect_list(shard).alias("shards")))
    found = rows.rdd.mapPartitions(partial(check_partition, rate, grant, ca))
    return blobs.sparkSession.createDataFrame(found, FINDING_DDL)
