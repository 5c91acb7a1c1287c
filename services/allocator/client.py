"""Typed async client of the allocator, used by access."""

from __future__ import annotations

import random
from collections.abc import Sequence

from libs.proto.allocator import AllocatorStat, AllocRequest, AllocResult, BlobSlice, UnusedSpace
from libs.rpc.client import HttpClient, ServiceClient
from libs.rpc.errors import Unavailable


class AllocatorClient(ServiceClient):
    """Tries the allocators in random order: any of them may serve any request."""

    def __init__(self, hosts: Sequence[str], http: HttpClient | None = None) -> None:
        if not hosts:
            raise ValueError("allocator client needs at least one host")
        super().__init__(http, timeout=10.0)
        self.hosts = [h.rstrip("/") for h in hosts]

    async def alloc(self, code_mode: int, size: int, blob_size: int, exclude_vids: Sequence[int] = (),
                    avoid_disks: Sequence[int] = (), bids: int | None = None,
                    returned: Sequence[UnusedSpace] = ()) -> list[BlobSlice]:
        """Space for an object (or `bids` bids sharing `size` bytes): never in `exclude_vids`, and on `avoid_disks`
        only when nothing else has room; `returned` is space earlier allocations did not use."""
        body = AllocRequest(code_mode=code_mode, size=size, blob_size=blob_size, exclude_vids=list(exclude_vids),
                            avoid_disks=list(avoid_disks), bids=bids, returned=list(returned))
        last: Exception | None = None
        for host in random.sample(self.hosts, len(self.hosts)):
            try:
                return (await self.http.call("POST", f"{host}/volume/alloc", AllocResult, body=body)).blobs
            except Unavailable as exc:
                last = exc
        raise Unavailable(f"no allocator could allocate: {last}")

    async def stat(self, host: str) -> AllocatorStat:
        return await self.http.call("GET", f"{host}/stat", AllocatorStat)
