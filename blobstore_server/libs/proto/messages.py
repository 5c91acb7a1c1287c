"""Kafka message bodies for shard repair and blob delete (JSON on the wire).

`retry` and `not_before` travel with the message so that a failed message re-published to a
`*_failed` topic carries its own back-off: a consumer skips nothing, it only waits.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class BlobMsg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster_id: int = Field(default=0, ge=0, lt=2**32, description="clusters may share one Kafka")
    vid: int = Field(ge=0, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)
    retry: int = Field(default=0, ge=0)
    not_before: float = Field(default=0.0, ge=0, description="unix time before which it is not worked on")

    def key(self) -> bytes:
        """Partition key: all messages about one blob land on one partition, in order."""
        return f"{self.vid}/{self.bid}".encode()

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()


class RepairMsg(BlobMsg):
    bad_indexes: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    reason: str = ""


class UploadSlice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    vid: int = Field(ge=0, lt=2**32)
    min_bid: int = Field(ge=0, lt=2**64)
    count: int = Field(ge=1, lt=2**32)


class DeleteMsg(BlobMsg):
    time: float = Field(ge=0, description="unix time of the DELETE; the safe delay counts from here")
    upload: tuple[UploadSlice, ...] = Field(default=(), max_length=4, description=(
        "a reclaim of a multipart upload (vid/bid is its first blob): every blob of these slices is "
        "deleted unless each one was written"))

    intent: str | None = Field(None, max_length=128, description=(
        "access's signature that this delete was asked for (libs/rpc/tickets.py): blobnodes with auth delete "
        "nothing without it"))

    def signed_intent(self) -> DeleteIntent | None:
        """What tinker hands each blobnode with its delete ticket."""
        if self.intent is None:
            return None
        return DeleteIntent(vid=self.vid, bid=self.bid, upload=self.upload, signature=self.intent)

    def blob_ids(self) -> list[tuple[int, int]]:
        """(vid, bid) of every blob the message deletes."""
        if not self.upload:
            return [(self.vid, self.bid)]
        return [(s.vid, bid) for s in self.upload for bid in range(s.min_bid, s.min_bid + s.count)]


class DeleteIntent(BaseModel):
    """A delete message's intent and what it signs: the blob vid/bid, or an upload's slices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vid: int = Field(ge=0, lt=2**32)
    bid: int = Field(ge=0, lt=2**64)
    upload: tuple[UploadSlice, ...] = Field(default=(), max_length=4)
    signature: str = Field(max_length=128)

    def slices(self) -> list[tuple[int, int, int]]:
        return [(s.vid, s.min_bid, s.count) for s in self.upload]
