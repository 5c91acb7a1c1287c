"""Typed async client of the dashboard's JSON endpoint (tests and scripts read what the page draws)."""

from __future__ import annotations

from blobstore_server.libs.proto.dashboard import Overview
from blobstore_server.libs.rpc.client import HttpClient, ServiceClient
from blobstore_server.libs.rpc.routes import NO_ROUTES


class DashboardClient(ServiceClient):
    def __init__(self, http: HttpClient | None = None) -> None:
        super().__init__(NO_ROUTES, http, timeout=10.0)  # its API is open: nothing of it is declared

    async def overview(self, host: str) -> Overview:
        return await self.http.call("GET", f"{host.rstrip('/')}/api/overview", Overview)
