"""Typed async client of the dashboard's JSON endpoint (tests and scripts read what the page draws)."""

from __future__ import annotations

from libs.proto.dashboard import Overview
from libs.rpc.client import HttpClient, ServiceClient


class DashboardClient(ServiceClient):
    def __init__(self, http: HttpClient | None = None) -> None:
        super().__init__(http, timeout=10.0)

    async def overview(self, host: str) -> Overview:
        return await self.http.call("GET", f"{host.rstrip('/')}/api/overview", Overview)
