"""The dashboard's async shell: scrape every process's /metrics, read clustermgr's disk table and
tinker's backlog in Kafka, each on its own loop, and keep the results for `overview()`.

Only while someone looks (an overview asked for within `watch_linger`) are all of them read: unwatched, the
loops scrape the access nodes alone, for the rate plots' history, since each scrape costs the scraped process
and the dashboard CPU that loaded processes on the same box miss. The first view after a quiet spell waits
for one fresh round, at most `scrape_timeout`; any other request is built from what the loops last saw, so a
process or Kafka that hangs shows up as stale or down, never as a dashboard that hangs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from urllib.parse import urlencode

from confluent_kafka import KafkaException

from blobstore_server.libs.mq.admin import LagReader
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.mq.topics import pipelines
from blobstore_server.libs.proto.clustermgr import DiskView
from blobstore_server.libs.proto.dashboard import Overview, RatePoint
from blobstore_server.libs.proto.scheduler import BROKEN_AFTER_KEY, TASK_PREFIX, TaskRecord, parse_broken_after
from blobstore_server.libs.rpc.client import HttpClient
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.dashboard.config import DashboardConfig, Target
from blobstore_server.services.dashboard.overview import TargetState, build_overview
from blobstore_server.services.dashboard.scrape import Scrape, rate_point, wanted

log = logging.getLogger(__name__)
BACKLOG_REFRESH = 5.0  # at most this often


class Watcher:
    def __init__(self, config: DashboardConfig, cluster: ClusterClient, http: HttpClient) -> None:
        self.config = config
        self.cluster = cluster
        self.http = http
        self.targets: dict[str, TargetState] = {t.url.rstrip("/"): TargetState(t) for t in config.targets}
        self.disks: list[DiskView] = []
        self.tasks: list[TaskRecord] = []
        self.broken_after: float | None = None
        self.cluster_error = "not asked yet"
        self.backlog: dict[str, int] | None = None
        self.series: deque[RatePoint] = deque(maxlen=max(2, int(config.history / config.scrape_interval)))
        self.lags = LagReader(config.kafka_bootstrap, timeout=3.0, client=client_auth(config.kafka_auth))
        self._viewed_at = -math.inf

    async def close(self) -> None:
        await asyncio.to_thread(self.lags.close)

    def watched(self) -> bool:
        return time.monotonic() - self._viewed_at < self.config.watch_linger

    async def overview(self) -> Overview:
        quiet = not self.watched()
        self._viewed_at = time.monotonic()
        if quiet:
            rounds = [asyncio.ensure_future(self._refresh_all())]
            if self.config.kafka_bootstrap:
                rounds.append(asyncio.ensure_future(self.refresh_backlog()))
            await asyncio.wait(rounds, timeout=self.config.scrape_timeout)
        return build_overview(list(self.targets.values()), self.disks, self.cluster_error, self.backlog,
                              self.series, self.config.scrape_interval, self.tasks, time.time(), self.broken_after)

    async def _refresh_all(self) -> None:
        await self.refresh_cluster()  # first: it names the blobnodes to scrape
        await self.scrape_all()

    async def scrape_loop(self) -> None:
        while True:
            started = time.monotonic()
            await self.scrape_all()
            await asyncio.sleep(max(0.0, self.config.scrape_interval - (time.monotonic() - started)))

    async def scrape_all(self) -> None:
        everyone = self.watched()
        states = [s for s in self.targets.values() if everyone or s.target.role == "access"]
        await asyncio.gather(*(self._scrape(state) for state in states))
        access = [(s.previous, s.latest) for s in states
                  if s.target.role == "access" and s.previous is not None and s.latest is not None]
        if access:
            self.series.append(rate_point(access))

    async def _scrape(self, state: TargetState) -> None:
        try:
            only = urlencode([("name[]", name) for name in wanted(state.target.role)])
            raw = await self.http.request("GET", f"{state.target.url}/metrics?{only}",
                                          timeout=self.config.scrape_timeout)
            state.scraped(await asyncio.to_thread(Scrape.parse, str(raw, "utf-8"), time.time()))
        except (RpcError, ValueError) as exc:
            state.failed(str(exc))

    async def cluster_loop(self) -> None:
        while True:
            if self.watched():
                await self.refresh_cluster()
            await asyncio.sleep(self.config.scrape_interval)

    async def refresh_cluster(self) -> None:
        try:
            self.disks = await self.cluster.list_disks()
            self.tasks = _task_records(await self.cluster.kv_list(TASK_PREFIX))
            self.broken_after = _broken_after(await self.cluster.list_config())
            self.cluster_error = ""
        except RpcError as exc:
            self.cluster_error = str(exc)
        for disk in self.disks:  # a blobnode nobody listed is found through its disks
            host = disk.host.rstrip("/")
            if host not in self.targets:
                self.targets[host] = TargetState(Target(name=host.split("://")[-1], role="blobnode", url=host))

    async def backlog_loop(self) -> None:
        if not self.config.kafka_bootstrap:
            return
        while True:
            if self.watched():
                await self.refresh_backlog()
            await asyncio.sleep(max(self.config.scrape_interval, BACKLOG_REFRESH))

    async def refresh_backlog(self) -> None:
        try:
            self.backlog = await asyncio.to_thread(self._read_backlog)
        except (KafkaException, OSError) as exc:
            log.warning("cannot read the backlog from Kafka: %s", exc)
            self.backlog = None

    def _read_backlog(self) -> dict[str, int]:
        """Messages each of tinker's consumer groups has not committed yet (blocking: run in a thread)."""
        backlog = {}
        for spec in pipelines(self.config.tinker_group_prefix):
            per_topic = self.lags.lag(spec.group, [str(t) for t in spec.topics])
            backlog[spec.name] = sum(n for parts in per_topic.values() for n in parts.values())
        return backlog


def _broken_after(config: dict[str, str]) -> float | None:
    try:
        return parse_broken_after(config.get(BROKEN_AFTER_KEY))
    except ValueError:
        return None


def _task_records(raw: dict[str, str]) -> list[TaskRecord]:
    records = []
    for key, value in raw.items():
        try:
            records.append(TaskRecord.model_validate_json(value))
        except ValueError as exc:
            log.warning("skipping task record %s: %s", key, str(exc).splitlines()[0])
    return records
