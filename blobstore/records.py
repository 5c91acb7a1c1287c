"""The access API's request and answer bodies: the SDK's records, and the models access's routes declare.

They live with the SDK, which depends on pydantic and nothing of the server, and the server imports them from here."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

MAX_OBJECT_SIZE = 5 << 30  # the largest object one Location can name


class PutResult(BaseModel):
    location: str
    size: int
    crc: int
    code_mode: str


class Slice(BaseModel):
    """`count` consecutive blobs from `min_bid` in volume `vid`."""

    model_config = ConfigDict(frozen=True)

    vid: int
    min_bid: int
    count: int


class Stat(BaseModel):
    """What a location says about its object: no blobnode is read to answer."""

    model_config = ConfigDict(frozen=True)

    size: int
    crc: int
    code_mode: str
    blob_size: int
    cluster_id: int
    blobs: tuple[Slice, ...]


class DeleteResult(BaseModel):
    queued_blobs: int


class UndeleteRequest(BaseModel):
    """Take back the DELETE of the object at `location` (POST /undelete, signed with the `undelete` capability)."""

    model_config = ConfigDict(extra="forbid")

    location: str = Field(pattern=r"^[A-Za-z0-9_-]{1,512}$")


class UndeleteResult(BaseModel):
    """An undelete that succeeded: the object reads back, and no delete of it issued before is carried out. An
    object that was never deleted (or whose delete tinker had not reached yet) answers with nothing unmarked."""

    model_config = ConfigDict(frozen=True)

    blobs: int
    unmarked: int  # shards whose delete mark was lifted
    missing: int  # shards already gone (purged, or never written): it decodes from the others; repairs are queued
    unreachable: int  # shards on blobnodes that did not answer: tinker lifts a mark left on one once it answers

    @property
    def degraded(self) -> bool:
        return self.missing > 0


class AllocRequest(BaseModel):
    """A multipart upload: allocate the whole object's blobs at once."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(ge=0, le=MAX_OBJECT_SIZE)
    code_mode: str | None = None  # default: the cluster's size policy


class AllocResult(BaseModel):
    location: str  # reads back once every blob is written; its CRC is 0 (the bytes are not seen in order)
    tokens: list[str]  # one per blob, in object order: PUT /blob/putat?token=T with that blob's bytes
    blob_size: int  # every blob holds this many bytes but the last, which holds the rest
    expiry: int  # unix seconds; the upload is reclaimed later unless every blob was written


class PutAtResult(BaseModel):
    vid: int
    bid: int
    size: int


@dataclass
class Upload:
    """A multipart upload: the object's Location and one token per part (blob). Parts may be sent in any
    order and in parallel; the object reads back once every part is written. Until `expiry` passing it
    back to `put(..., upload=)` sends only the parts not yet `done`; after, the upload is reclaimed."""

    location: str
    tokens: list[str]
    blob_size: int
    size: int
    expiry: int
    done: set[int] = field(default_factory=set)

    @property
    def missing(self) -> list[int]:
        return [i for i in range(len(self.tokens)) if i not in self.done]

    def part_size(self, index: int) -> int:
        return min(self.blob_size, self.size - index * self.blob_size)


READ_PLAN_TYPE = "application/vnd.blobstore.read-plan+json"  # a GET that accepts it may be answered a `ReadPlan`


class ShardPiece(BaseModel):
    """One request of a direct read: GET `url` with `headers` answers the next `size` bytes of the range."""

    url: str
    headers: dict[str, str] = Field(default_factory=dict)  # the request's signature when the cluster signs them
    size: int = Field(ge=0)


class ReadPlan(BaseModel):
    """Where a large GET's bytes are: the data shards' ranges on blobnodes, in order, which the client reads itself
    (and joins) instead of through access. Each signed request is good once and for a minute; a piece that fails
    or is later than `piece_timeout` seconds is read through access instead, from that byte on."""

    size: int = Field(ge=0)
    pieces: list[ShardPiece]
    piece_timeout: float = Field(gt=0)
