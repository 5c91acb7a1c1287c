"""The allocator's figures, read from its pool at scrape time."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import Metric

from blobstore_server.libs.rpc.metrics import gauge
from blobstore_server.services.allocator.pool import VolumePool


def pool_figures(pool: VolumePool, lease_margin: float) -> Iterator[Metric]:
    now = time.monotonic()
    leased: Counter[str] = Counter()
    free: Counter[str] = Counter()
    for volume in pool.volumes.values():
        if volume.lease_until - lease_margin > now:
            mode = volume.code_mode.name
            leased[mode] += 1
            free[mode] += volume.free
    yield gauge("blobstore_allocator_leased_volumes", "Volumes leased and allocatable, by code mode",
                [((mode,), n) for mode, n in leased.items()], ["code_mode"])
    yield gauge("blobstore_allocator_leased_free_bytes", "Free bytes on a unit of each leased volume, summed by code "
                "mode (as shards take them on disk: a 1 KiB object takes 4 KiB)",
                [((mode,), n) for mode, n in free.items()], ["code_mode"])
    yield gauge("blobstore_allocator_free_bids", "Blob ids fetched from clustermgr and not handed out yet",
                pool.bids.left)
