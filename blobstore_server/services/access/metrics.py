"""access's own figures (the request counts, latencies and body bytes per route are libs.rpc.metrics')."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from blobstore_server.libs.rpc.metrics import Exchange

BYTES_IN = Counter("blobstore_access_bytes_in", "Request body bytes received (PUT: the objects' bytes)")
BYTES_OUT = Counter("blobstore_access_bytes_out", "Response body bytes sent (GET: the objects' bytes)")
QUORUM_MISSES = Counter("blobstore_access_put_quorum_misses", "Blobs whose shards missed the put quorum")
VOLUME_RETRIES = Counter("blobstore_access_put_volume_retries",
                         "Blobs written again on another volume after missing the quorum on the first")
DEGRADED_READS = Counter("blobstore_access_degraded_reads", "Blob reads rebuilt from parity shards")
HEDGED_READS = Counter("blobstore_access_hedged_reads",
                       "Blob reads that also asked parity shards because a data shard was slower than hedge_after")
TAIL_HEDGED_READS = Counter("blobstore_access_tail_hedged_reads", "Small blob reads that also asked other shards "
                            "because a data shard was slower than the recent tail of shard reads (tail_hedge_quantile)")
READ_PLANS = Counter("blobstore_access_read_plans", "GETs answered with a read plan: the client read the data shards "
                     "from the blobnodes itself")
PLANNED_BYTES = Counter("blobstore_access_planned_bytes", "The objects' bytes of the GETs answered with a read plan")

STANDBY_ALLOCATIONS = Counter("blobstore_access_standby_allocations",
                              "Objects (or retried blobs) given space from the standby stock: no allocator answered")
STANDBY_HELD = Gauge("blobstore_access_standby_held", "The standby stock per code mode: bids, bytes, and seconds "
                     "until the last of it can no longer be written", ["code_mode", "what"])

REGION_FREE = Gauge("blobstore_access_region_free_bytes", "Writable free bytes of each cluster of the region as "
                    "last measured: PUTs go to a cluster in proportion (0: full, read-only or silent)", ["cluster_id"])

OUTBOX_HELD = Gauge("blobstore_access_outbox_messages", "Repair and delete messages waiting for mqproxy to take them")
OUTBOX_DROPPED = Counter("blobstore_access_outbox_dropped", "Messages dropped because the outbox was full", ["kind"])


def count_bytes(exchange: Exchange) -> None:
    BYTES_IN.inc(exchange.bytes_in)
    BYTES_OUT.inc(exchange.bytes_out)
