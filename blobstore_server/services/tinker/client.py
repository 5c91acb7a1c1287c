"""Typed async client of tinker, used by the CLI."""

from __future__ import annotations

from blobstore_server.libs.proto import tinker as api
from blobstore_server.libs.proto.tinker import TinkerStats
from blobstore_server.libs.rpc.client import HttpClient, ServiceClient


class TinkerClient(ServiceClient):
    def __init__(self, http: HttpClient | None = None) -> None:
        super().__init__(api.ROUTES, http, timeout=15.0)

    async def stats(self, host: str) -> TinkerStats:
        """Each pipeline's counters and its consumer group's lag per topic and partition."""
        return await self.http.call_route(api.STATS, host)
