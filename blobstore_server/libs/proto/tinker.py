"""The tinker API: what each pipeline has done and how far its consumer group lags."""

from __future__ import annotations

from pydantic import BaseModel, Field

from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable


class PipelineStats(BaseModel):
    messages_in: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    undeleted: int = 0  # deletes an undelete took back (some blob of the message was left as it was)
    paused: bool = False  # its task switch is off: nothing new is fetched, nothing is worked on
    lag: dict[str, dict[int, int]] = Field(default_factory=dict)  # topic -> partition -> messages

    @property
    def total_lag(self) -> int:
        return sum(n for parts in self.lag.values() for n in parts.values())


class TinkerStats(BaseModel):
    pipelines: dict[str, PipelineStats]


# Routes: each declared once, served by the app, called by the client, checked by auth (libs/rpc/routes.py).

STATS = Route("GET", "/stats", C.OBSERVE, TinkerStats)
ROUTES = RouteTable(STATS)
