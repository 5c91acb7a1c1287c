"""The access API's JSON answers, shared by its routes and the SDK."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from libs.ec import parse_code_mode
from libs.proto.body import RequestBody
from libs.proto.location import MAX_OBJECT_SIZE, Location


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

    @classmethod
    def of(cls, location: Location) -> Stat:
        return cls(size=location.size, crc=location.crc, code_mode=parse_code_mode(location.code_mode).name,
                   blob_size=location.blob_size, cluster_id=location.cluster_id,
                   blobs=tuple(Slice(vid=s.vid, min_bid=s.min_bid, count=s.count) for s in location.blobs))


class DeleteResult(BaseModel):
    queued_blobs: int


class AllocRequest(RequestBody):
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
