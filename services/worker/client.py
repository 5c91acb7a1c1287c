"""Typed async client of the worker, used by tinker."""

from __future__ import annotations

from typing import Any

from libs.rpc.client import HttpClient, ServiceClient


class WorkerClient(ServiceClient):
    def __init__(self, http: HttpClient | None = None) -> None:
        super().__init__(http, timeout=120.0)  # a repair reads and writes whole shards




    async def repair_shards(self, host: str, vid: int, bid: int, bad_indexes: list[int]) -> dict[str, Any]:
        """Rebuild the named shards; `skipped` in the answer says why nothing was written, if so."""
        body = {"vid": vid, "bid": bid, "bad_indexes": bad_indexes}
        return dict(await self.http.call("POST", f"{host}/shard/repair", json=body))

    async def stats(self, host: str) -> dict[str, Any]:
        return dict(await self.http.call("GET", f"{host}/stats"))
