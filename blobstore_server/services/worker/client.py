"""Typed async client of the worker, used by tinker."""

from __future__ import annotations

from blobstore_server.libs.proto import worker as api
from blobstore_server.libs.proto.worker import RepairResult, ShardRepair, WorkerStats
from blobstore_server.libs.rpc.client import HttpClient, ServiceClient


class WorkerClient(ServiceClient):
    def __init__(self, http: HttpClient | None = None) -> None:
        super().__init__(api.ROUTES, http, timeout=120.0)  # a repair reads and writes whole shards

    async def repair_shards(self, host: str, vid: int, bid: int, bad_indexes: list[int]) -> RepairResult:
        """Rebuild the named shards; `skipped` in the answer says why nothing was written, if so."""
        body = ShardRepair(vid=vid, bid=bid, bad_indexes=bad_indexes)
        return await self.http.call_route(api.SHARD_REPAIR, host, body=body)

    async def stats(self, host: str) -> WorkerStats:
        return await self.http.call_route(api.STATS, host)
