"""Topic names and tinker's pipelines over them, declared once."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Topic(StrEnum):
    SHARD_REPAIR = "shard_repair"
    SHARD_REPAIR_PRIOR = "shard_repair_prior"
    SHARD_REPAIR_FAILED = "shard_repair_failed"
    BLOB_DELETE = "blob_delete"
    BLOB_DELETE_FAILED = "blob_delete_failed"
    UPLOAD_RECLAIM = "upload_reclaim"  # multipart uploads to delete unless finished, due after a day: own lag


ALL_TOPICS: tuple[Topic, ...] = tuple(Topic)


@dataclass(frozen=True)
class PipelineSpec:
    """One of tinker's pipelines: its name, its consumer group and the topics it consumes."""

    name: str
    group: str
    topics: tuple[Topic, ...]


# Priority repairs have a group of their own so a backlog of ordinary repairs never stands in front of them.
PIPELINE_TOPICS: dict[str, tuple[Topic, ...]] = {
    "repair_prior": (Topic.SHARD_REPAIR_PRIOR,),
    "repair": (Topic.SHARD_REPAIR, Topic.SHARD_REPAIR_FAILED),
    "delete": (Topic.BLOB_DELETE, Topic.BLOB_DELETE_FAILED),
    "reclaim": (Topic.UPLOAD_RECLAIM,),  # a retry goes back to the same topic with its back-off
}


def pipelines(group_prefix: str) -> list[PipelineSpec]:
    """Every pipeline; its consumer group is "<group_prefix>-<name>"."""
    return [PipelineSpec(name, f"{group_prefix}-{name.replace('_', '-')}", topics)
            for name, topics in PIPELINE_TOPICS.items()]
