"""The worker's figures, read from its repair and migration counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from blobstore_server.libs.proto.worker import MigrateStats, WorkerStats
from blobstore_server.libs.rpc.metrics import counter


def repair_figures(stats: WorkerStats) -> Iterator[Metric]:
    yield counter("blobstore_worker_repaired_shards", "Shards rebuilt and written back", stats.repaired_shards)
    yield counter("blobstore_worker_repaired_bytes", "Bytes of rebuilt shards written back", stats.repaired_bytes)
    yield counter("blobstore_worker_repairs_skipped", "Repairs with nothing to do (healthy, or being deleted)",
                  stats.skipped)
    yield counter("blobstore_worker_repairs_failed", "Repairs that failed (the caller retries)", stats.failed)


def migrate_figures(stats: MigrateStats) -> Iterator[Metric]:
    yield counter("blobstore_worker_migrated_shards", "Shards brought onto new units, by how",
                  [(("copied",), stats.copied_shards), (("rebuilt",), stats.rebuilt_shards),
                   (("resumed",), stats.resumed_shards), (("left",), stats.left_shards),
                   (("lost",), stats.lost_shards)], ["how"])
    yield counter("blobstore_worker_migrated_bytes", "Bytes written onto new units", stats.written_bytes)
    yield counter("blobstore_worker_tasks_given_up", "Tasks this worker stopped touching unfinished, by why: its "
                  "lease may have lapsed (no renewal in time), or its hold was refused (fenced)",
                  [(("lapsed",), stats.lapsed_tasks), (("fenced",), stats.fenced_tasks)], ["why"])
