"""A region (as in CubeFS BlobStore): one access layer in front of several clusters.

A PUT goes to a cluster drawn at random weighted by the free space of its writable disks, so clusters
fill evenly; a cluster without writable space (full, read-only or unheard from) gets none. GET, DELETE,
undelete and stat go to the cluster the Location names; an upload token names its cluster too. With one cluster
this is a plain pass-through.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from blobstore.records import ReadPlan, UndeleteResult
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.proto.uploads import BlobToken
from blobstore_server.libs.rpc.errors import NotFound, RpcError, Unavailable
from blobstore_server.services.access.blobs import Sent
from blobstore_server.services.access.metrics import REGION_FREE
from blobstore_server.services.access.objects import ObjectStore
from blobstore_server.services.access.undelete import undelete
from blobstore_server.services.clustermgr.client import ClusterClient

log = logging.getLogger(__name__)


def writable_free(disks: Sequence[DiskView]) -> int:
    """Bytes a cluster can take new volumes on: the free space of its alive, writable disks."""
    return sum(d.free for d in disks if d.alive and d.writable)


def put_order(free: Mapping[int, int], draw: float) -> list[int]:
    """Clusters in the order a PUT tries them: the first drawn with probability proportional to its free
    space (`draw` uniform in [0, 1)), the others after it by free space; clusters with none never."""
    candidates = sorted((cid for cid, f in free.items() if f > 0), key=lambda cid: (-free[cid], cid))
    if not candidates:
        return []
    total = sum(free[cid] for cid in candidates)
    point, first = draw * total, candidates[-1]
    for cid in candidates:
        point -= free[cid]
        if point < 0:
            first = cid
            break
    return [first, *(cid for cid in candidates if cid != first)]


class _Counted:
    """A request body that remembers whether any of it was read (until then a PUT may go elsewhere)."""

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        self._body = body
        self.started = False

    def __aiter__(self) -> _Counted:
        return self

    async def __anext__(self) -> bytes:
        self.started = True
        return await anext(self._body)


class Region:
    def __init__(self, stores: Mapping[int, ObjectStore], managers: Mapping[int, ClusterClient], secret: bytes,
                 rng: random.Random | None = None) -> None:
        self.stores = dict(stores)
        self.managers = dict(managers)
        self.secret = secret
        self.free: dict[int, int] = {cid: 1 for cid in self.stores}  # equal until first measured
        self._rng = rng or random.Random()

    async def refresh(self) -> None:
        """Measure each cluster's writable free space; a cluster that does not answer takes no PUTs."""
        async def measure(cid: int) -> int:
            try:
                return writable_free(await self.managers[cid].list_disks())
            except RpcError as exc:
                log.warning("cluster %d: cannot list its disks: %s", cid, exc)
                return 0

        sizes = await asyncio.gather(*(measure(cid) for cid in self.managers))
        self.free = dict(zip(self.managers, sizes, strict=True))
        for cid, free in self.free.items():
            REGION_FREE.labels(str(cid)).set(free)

    def _order(self) -> list[int]:
        if len(self.stores) == 1:
            return list(self.stores)
        order = put_order(self.free, self._rng.random())
        if not order:
            raise Unavailable(f"no cluster of the region has writable space (free bytes: {self.free})")
        return order

    def store_of(self, cluster_id: int) -> ObjectStore:
        try:
            return self.stores[cluster_id]
        except KeyError:
            raise NotFound(f"cluster {cluster_id} is not served by this access layer") from None

    async def put(self, body: AsyncIterator[bytes], size: int, mode: CodeMode | None) -> Location:
        counted = _Counted(body)
        order = self._order()
        for cid in order:
            try:
                return await self.stores[cid].put(counted, size, mode)
            except Unavailable as exc:
                if counted.started or cid == order[-1]:
                    raise
                log.warning("cluster %d could not take a PUT, trying the next: %s", cid, exc)
        raise AssertionError("unreachable: the last cluster's failure is raised")

    async def alloc(self, size: int, mode: CodeMode | None) -> tuple[Location, list[BlobToken]]:
        order = self._order()
        for cid in order:
            try:
                return await self.stores[cid].alloc(size, mode)
            except Unavailable as exc:
                if cid == order[-1]:
                    raise
                log.warning("cluster %d could not allocate an upload, trying the next: %s", cid, exc)
        raise AssertionError("unreachable: the last cluster's failure is raised")

    async def put_at(self, token: str, body: AsyncIterator[bytes], size: int) -> BlobToken:
        blob = BlobToken.from_token(token, self.secret, time.time())
        await self.store_of(blob.cluster_id).put_at(blob, body, size)
        return blob

    def parse(self, token: str) -> Location:
        return Location.from_token(token, self.secret)

    def read(self, location: Location, offset: int, length: int, deferred: bool = False) -> AsyncIterator[Sent]:
        return self.store_of(location.cluster_id).read(location, offset, length, deferred)

    async def read_plan(self, location: Location, offset: int, length: int) -> ReadPlan | None:
        return await self.store_of(location.cluster_id).read_plan(location, offset, length)

    async def delete(self, location: Location) -> int:
        return await self.store_of(location.cluster_id).delete(location)

    async def undelete(self, location: Location) -> UndeleteResult:
        return await undelete(self.store_of(location.cluster_id), self.managers[location.cluster_id], location)
