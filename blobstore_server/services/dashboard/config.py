"""Dashboard configuration (`python -m blobstore_server.services.dashboard -c dashboard.json`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from blobstore_server.libs.mq.settings import KafkaAuth
from blobstore_server.libs.rpc.config import ServiceSettings


class Target(BaseModel):
    """A process whose /metrics the dashboard scrapes."""

    name: str
    role: str  # clustermgr, blobnode, access, allocator, worker, mqproxy, tinker, ...
    url: str


class DashboardConfig(ServiceSettings):
    bind_addr: str = "127.0.0.1:9900"
    clustermgr_hosts: list[str] = Field(min_length=1)
    # The processes to show; blobnodes found in clustermgr's disk table are added to them.
    targets: list[Target] = Field(default_factory=list)
    kafka_bootstrap: str = ""  # where tinker's backlog is read; empty: the backlog is not shown
    kafka_auth: KafkaAuth | None = None  # the read-only `backlog` login on a Kafka that takes logins only
    tinker_group_prefix: str = "tinker"
    scrape_interval: float = Field(2.0, ge=0.2)
    scrape_timeout: float = Field(2.0, gt=0)
    # Every process is scraped only this long after the last view; unwatched, only access nodes (for the plots).
    watch_linger: float = Field(60.0, gt=0)
    history: float = Field(600.0, gt=0)  # seconds of PUT/GET rates and latencies kept for the plots
