from __future__ import annotations

from collections import Counter

from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.services.access.region import put_order, writable_free


def _disk(disk_id: int, free: int, *, alive: bool = True, status: DiskStatus = DiskStatus.NORMAL,
          readonly: bool = False) -> DiskView:
    return DiskView(disk_id=disk_id, host="h", idc="z", rack="r", path="/d", status=status, readonly=readonly,
                    size=100, free=free, alive=alive)


def test_first_choices_follow_free_space() -> None:
    free = {1: 100, 2: 300, 3: 0}
    draws = [i / 4000 for i in range(4000)]
    firsts = Counter(put_order(free, d)[0] for d in draws)
    assert firsts == {1: 1000, 2: 3000}  # in proportion; the cluster without space never


def test_the_others_follow_as_fallbacks_by_free_space() -> None:
    free = {1: 100, 2: 300, 3: 200}
    assert put_order(free, 0.0) == [2, 3, 1]
    assert put_order(free, 0.99) == [1, 2, 3]
    assert put_order({1: 0, 2: 0}, 0.5) == []
    assert put_order({}, 0.5) == []


def test_only_alive_writable_disks_count() -> None:
    disks = [_disk(1, 10), _disk(2, 20, alive=False), _disk(3, 40, readonly=True),
             _disk(4, 80, status=DiskStatus.BROKEN), _disk(5, 160)]
    assert writable_free(disks) == 170
