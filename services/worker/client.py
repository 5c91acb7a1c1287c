"""Typed async client of the worker, used by tinker."""

from __future__ import annotations

from typing import Any

from libs.rpc.client import HttpClient


class WorkerClient:
    def __init__(self, http: HttpClient | None = None) -> None:
        self.http = http or HttpClient(timeout=120.0)

    async def close(self) -> None:
        await self.http.close()

    async def __aenter__(self) -> WorkerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def repair_shards(self, host: str, vid: int, bid: int, bad_indexes: list[int]) -> dict[str, Any]:
        """Rebuild the named shards; `skipped` in the answer says why nothing was written, if so."""
        body = {"vid": vid, "bid": bid, "bad_indexes": bad_indexes}
        return dict(await self.http.call("POST", f"{host}/shard/repair", json=body))

    async def stats(self, host: str) -> dict[str, Any]:
        return dict(await self.http.call("GET", f"{host}/stats"))
