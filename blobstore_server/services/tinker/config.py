"""tinker configuration (`python -m blobstore_server.services.tinker -c tinker.json`)."""

from __future__ import annotations

from pydantic import Field

from blobstore_server.libs.mq.settings import MessageServiceSettings


class TinkerConfig(MessageServiceSettings):
    bind_addr: str = "127.0.0.1:9700"
    cluster_id: int = Field(1, ge=0, lt=2**32)  # messages of other clusters sharing the Kafka are skipped
    clustermgr_hosts: list[str] = Field(min_length=1)
    group_prefix: str = "tinker"  # consumer groups are <prefix>-repair-prior, <prefix>-repair, <prefix>-delete
    # seconds a deleted blob's shards stay marked (recoverable) before tinker removes them for good; its blobnodes'
    # delete_hold should be the same (`cluster up` and `deploy render` set both), or they refuse the removal
    delete_safe_delay: float = Field(4 * 3600.0, ge=0)
    delete_log: str = "tinker-deletes.jsonl"
    retry_base: float = Field(1.0, gt=0)  # back-off of a failed message: base * 2^(retry-1), capped
    retry_cap: float = Field(300.0, gt=0)
    concurrency: int = Field(16, ge=1)  # messages worked on at once per pipeline
    commit_interval: float = Field(0.5, gt=0)
    switch_interval: float = Field(2.0, gt=0)  # how often the task switches are re-read from clustermgr
    shard_timeout: float = Field(30.0, gt=0)
