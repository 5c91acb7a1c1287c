"""Which shard puts skip the page cache (`direct_write_bytes`)."""

from __future__ import annotations

import pytest

from blobstore_server.libs.proto.blobnode import IOClass
from blobstore_server.services.blobnode.node import writes_direct

MiB = 1 << 20


@pytest.mark.parametrize(("io_class", "size", "threshold", "direct"), [
    (IOClass.USER, 64 << 10, MiB, False),  # small user shards stay cached: they are read back soonest
    (IOClass.USER, MiB - 1, MiB, False),
    (IOClass.USER, MiB, MiB, True),
    (IOClass.USER, 16 * MiB, MiB, True),
    (IOClass.BACKGROUND, 10, MiB, True),  # rebuilt and migrated shards, whatever their size
    (IOClass.URGENT, 10, MiB, True),
    (IOClass.USER, 16 * MiB, 0, False),  # 0: everything through the page cache
    (IOClass.BACKGROUND, 16 * MiB, 0, False),
])
def test_large_and_background_shards_skip_the_page_cache(io_class: IOClass, size: int, threshold: int,
                                                         direct: bool) -> None:
    assert writes_direct(io_class, size, threshold) is direct
