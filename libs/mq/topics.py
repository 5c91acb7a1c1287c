"""Topic names, declared once."""

from __future__ import annotations

from enum import StrEnum


class Topic(StrEnum):
    SHARD_REPAIR = "shard_repair"
    SHARD_REPAIR_PRIOR = "shard_repair_prior"
    SHARD_REPAIR_FAILED = "shard_repair_failed"
    BLOB_DELETE = "blob_delete"
    BLOB_DELETE_FAILED = "blob_delete_failed"


ALL_TOPICS: tuple[Topic, ...] = tuple(Topic)
