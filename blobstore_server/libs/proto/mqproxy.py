"""The mqproxy API: repair and delete messages in, how many Kafka took out."""

from __future__ import annotations

from pydantic import BaseModel, Field

from blobstore_server.libs.proto.body import RequestBody
from blobstore_server.libs.proto.messages import UploadSlice
from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable

MAX_BATCH = 10_000


class RepairIn(RequestBody):
    vid: int = Field(ge=1, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)
    bad_indexes: list[int] = Field(min_length=1)
    reason: str = ""
    priority: bool = False


class DeleteIn(RequestBody):
    vid: int = Field(ge=1, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)
    after: float = Field(0.0, ge=0, le=31 * 86400)  # seconds from now before the delete begins
    upload: list[UploadSlice] = Field(default_factory=list, max_length=4)  # see DeleteMsg.upload
    intent: str | None = Field(None, max_length=128)  # see DeleteMsg.intent; the client signs it (`MqProxyClient`)


class RepairBatch(RequestBody):
    messages: list[RepairIn] = Field(min_length=1, max_length=MAX_BATCH)


class DeleteBatch(RequestBody):
    messages: list[DeleteIn] = Field(min_length=1, max_length=MAX_BATCH)


class Queued(BaseModel):
    queued: int


class PublisherStats(BaseModel):
    messages_in: int = 0
    failed: int = 0
    unconfirmed: int = 0  # answered 503 before Kafka confirmed them; they may still be delivered
    sent: dict[str, int] = Field(default_factory=dict)  # per topic


# Routes: each declared once, served by the app, called by the client, checked by auth (libs/rpc/routes.py).

REPAIR = Route("POST", "/repairmsg", C.QUEUE_REPAIR, Queued, RepairBatch)
DELETE = Route("POST", "/deletemsg", C.QUEUE_DELETE, Queued, DeleteBatch)
STATS = Route("GET", "/stats", C.OBSERVE, PublisherStats)
ROUTES = RouteTable(REPAIR, DELETE, STATS)
