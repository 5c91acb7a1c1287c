"""Typed async client of mqproxy, used by access (and the CLI): hand repair and delete messages to
Kafka through any live mqproxy. A call returns only once Kafka acknowledged every message."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from pydantic import BaseModel

from blobstore_server.libs.proto import mqproxy as api
from blobstore_server.libs.proto.mqproxy import DeleteBatch, DeleteIn, PublisherStats, Queued, RepairBatch, RepairIn
from blobstore_server.libs.rpc.client import HttpClient, ServiceClient
from blobstore_server.libs.rpc.errors import Unavailable
from blobstore_server.libs.rpc.routes import Route
from blobstore_server.libs.rpc.tickets import IntentSigner
from blobstore_server.services.clustermgr.client import ClusterClient

DISCOVERY_TTL = 10.0


class MqProxyClient(ServiceClient):
    """Static `hosts`, or the live "mqproxy" services registered in clustermgr when none are given. `intents`: the
    signer of the delete intents every delete message carries (access's, or the operator's); None: they go
    unsigned, and a blobnode with auth deletes nothing of theirs."""

    def __init__(self, hosts: Sequence[str] = (), cluster: ClusterClient | None = None,
                 http: HttpClient | None = None, intents: IntentSigner | None = None) -> None:
        if not hosts and cluster is None:
            raise ValueError("mqproxy client needs hosts or a clustermgr to discover them")
        self._static = [h.rstrip("/") for h in hosts]
        self._intents = intents
        self._cluster = cluster
        self._found: tuple[float, list[str]] = (0.0, [])
        super().__init__(api.ROUTES, http)

    async def _hosts(self) -> list[str]:
        if self._static:
            return self._static
        if self._found[0] < time.monotonic() and self._cluster is not None:
            hosts = [s.host for s in await self._cluster.list_services("mqproxy")]
            self._found = (time.monotonic() + DISCOVERY_TTL if hosts else 0.0, hosts)
        return self._found[1]

    async def _post(self, route: Route[Queued], batch: BaseModel, count: int) -> int:
        hosts = await self._hosts()
        last: Exception = Unavailable("no mqproxy is registered")
        for host in random.sample(hosts, len(hosts)):
            try:
                return (await self.http.call_route(route, host, body=batch)).queued
            except Unavailable as exc:
                last = exc
        self._found = (0.0, [])
        raise Unavailable(f"no mqproxy took {count} message(s) for {route.path}: {last}")

    async def send_repair(self, messages: list[RepairIn]) -> int:
        """How many were queued (all of them, or it raises)."""
        return await self._post(api.REPAIR, RepairBatch(messages=messages), len(messages))

    async def send_delete(self, messages: list[DeleteIn]) -> int:
        if (intents := self._intents) is not None:
            messages = [m if m.intent else m.model_copy(update={"intent": intents.sign(
                m.vid, m.bid, [(s.vid, s.min_bid, s.count) for s in m.upload])}) for m in messages]
        return await self._post(api.DELETE, DeleteBatch(messages=messages), len(messages))

    async def stats(self, host: str) -> PublisherStats:
        return await self.http.call_route(api.STATS, host)
