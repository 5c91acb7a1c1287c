"""The access API's JSON answers, shared by its routes and the SDK."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from libs.ec import parse_code_mode
from libs.proto.location import Location


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
