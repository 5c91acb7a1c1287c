"""Typed async client of mqproxy, used by access (and the CLI): hand repair and delete messages to
Kafka through any live mqproxy. A call returns only once Kafka acknowledged every message."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from libs.rpc.client import HttpClient, ServiceClient
from libs.rpc.errors import Unavailable
from services.clustermgr.client import ClusterClient

DISCOVERY_TTL = 10.0


class MqProxyClient(ServiceClient):
    """Static `hosts`, or the live "mqproxy" services registered in clustermgr when none are given."""

    def __init__(self, hosts: Sequence[str] = (), cluster: ClusterClient | None = None,
                 http: HttpClient | None = None) -> None:
        if not hosts and cluster is None:
            raise ValueError("mqproxy client needs hosts or a clustermgr to discover them")
        self._static = [h.rstrip("/") for h in hosts]
        self._cluster = cluster
        self._found: tuple[float, list[str]] = (0.0, [])
        super().__init__(http)


    async def _hosts(self) -> list[str]:
        if self._static:
            return self._static
        if self._found[0] < time.monotonic() and self._cluster is not None:
            hosts = [s.host for s in await self._cluster.list_services("mqproxy")]
            self._found = (time.monotonic() + DISCOVERY_TTL if hosts else 0.0, hosts)
        return self._found[1]

    async def _post(self, path: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        hosts = await self._hosts()
        last: Exception = Unavailable("no mqproxy is registered")
        for host in random.sample(hosts, len(hosts)):
            try:
                return dict(await self.http.call("POST", f"{host}{path}", json={"messages": messages}))
            except Unavailable as exc:
                last = exc
        self._found = (0.0, [])
        raise Unavailable(f"no mqproxy took {len(messages)} message(s) for {path}: {last}")

    async def send_repair(self, messages: list[dict[str, Any]], priority: bool = False) -> dict[str, Any]:
        """Each message: {vid, bid, bad_indexes, reason}."""
        return await self._post("/repairmsg", [{**m, "priority": priority} for m in messages])

    async def send_delete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """Each message: {vid, bid}."""
        return await self._post("/deletemsg", messages)

    async def stats(self, host: str) -> dict[str, Any]:
        return dict(await self.http.call("GET", f"{host}/stats"))
