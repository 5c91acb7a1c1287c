"""Typed async client of the allocator, used by access."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto import allocator as api
from blobstore_server.libs.proto.allocator import AllocatorStat, AllocRequest, BlobSlice, UnusedSpace
from blobstore_server.libs.rpc.client import HttpClient, ServiceClient
from blobstore_server.libs.rpc.errors import Unavailable, Unreachable


class AllocatorClient(ServiceClient):
    """Any allocator may serve any request: they are tried in random order, each for at most `attempt_timeout`
    seconds. One that does not answer at all is passed over for `punish` seconds, so while it is down no request
    waits on it; when every allocator is passed over, a request fails at once (access then rides on what it
    holds) and a `probe` (access's background refill) is what finds them back. The volumes found full
    (`volume_full`) go with the next request that an allocator answers."""

    def __init__(self, hosts: Sequence[str], http: HttpClient | None = None, attempt_timeout: float = 1.0,
                 punish: float = 10.0) -> None:
        if not hosts:
            raise ValueError("allocator client needs at least one host")
        super().__init__(api.ROUTES, http, timeout=10.0)
        self.hosts = [h.rstrip("/") for h in hosts]
        self.attempt_timeout = attempt_timeout
        self.punish = punish
        self._unreachable_until: dict[str, float] = {}
        self._full: set[int] = set()  # vids a blobnode answered ChunkFull for, not told to an allocator yet

    def _order(self, now: float, probe: bool) -> list[str]:
        hosts = random.sample(self.hosts, len(self.hosts))
        return hosts if probe else [h for h in hosts if self._unreachable_until.get(h, 0.0) <= now]

    def volume_full(self, vid: int) -> None:
        """A blobnode answered ChunkFull for a shard of volume `vid`: tell the allocators with the next request."""
        self._full.add(vid)

    async def alloc(self, code_mode: CodeMode, size: int, blob_size: int, exclude_vids: Sequence[int] = (),
                    avoid_disks: Sequence[int] = (), bids: int | None = None,
                    returned: Sequence[UnusedSpace] = (), probe: bool = False) -> list[BlobSlice]:
        """Space for an object (or `bids` bids sharing `size` bytes): never in `exclude_vids`, and on `avoid_disks`
        only when nothing else has room; `returned` is space earlier allocations did not use. `probe` tries the
        allocators passed over too."""
        body = AllocRequest(code_mode=code_mode, size=size, blob_size=blob_size, exclude_vids=list(exclude_vids),
                            avoid_disks=list(avoid_disks), bids=bids, returned=list(returned),
                            full_vids=sorted(self._full)[:api.MAX_EXCLUDED])
        failures: list[str] = []
        hosts = self._order(time.monotonic(), probe)
        for host in hosts:
            try:
                result = await self.http.call_route(api.ALLOC, host, body=body,
                                              timeout=self.attempt_timeout)
            except Unreachable as exc:
                self._unreachable_until[host] = time.monotonic() + self.punish
                failures.append(str(exc))
                continue
            except Unavailable as exc:
                failures.append(str(exc))
                continue
            self._unreachable_until.pop(host, None)
            self._full.difference_update(body.full_vids)
            return result.blobs
        if not hosts:
            failures.append(f"none of {len(self.hosts)} answered lately")
        raise Unavailable(f"no allocator could allocate: {'; '.join(failures)}")

    async def stat(self, host: str) -> AllocatorStat:
        return await self.http.call_route(api.STAT, host)
