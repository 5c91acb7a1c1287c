"""Topic creation and consumer-lag reporting (blocking calls: from async code use asyncio.to_thread)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress

from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import OffsetSpec
from kafka.errors import KafkaError, TopicAlreadyExistsError

from libs.mq.offsets import TopicPartition as TP
from libs.mq.topics import ALL_TOPICS


@contextmanager
def _admin(bootstrap: str) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="blobstore-admin")
    try:
        yield admin
    finally:
        admin.close()


def ensure_topics(bootstrap: str, partitions: int, topics: Iterable[str] = ALL_TOPICS) -> list[str]:
    """Create the topics that do not exist yet; returns the names created. Safe to call from every process."""
    wanted = [str(t) for t in topics]
    with _admin(bootstrap) as admin:
        missing = [t for t in wanted if t not in set(admin.list_topics())]
        if missing:
            # Another process may win the race for some of them; the broker still creates the rest.
            with suppress(TopicAlreadyExistsError):
                admin.create_topics({t: {"num_partitions": partitions} for t in missing}, wait_for_metadata=True)
            admin.wait_for_topics(wanted)
    return missing


def positions(bootstrap: str, group: str, topics: Iterable[str], timeout: float = 10.0) -> dict[TP, tuple[int, int]]:
    """Per existing partition of `topics`: (where `group` resumes, the end offset). A partition the group never
    committed resumes at its earliest retained offset, so the messages between the two are not consumed yet.

    The group coordinator may not exist yet (no group ever joined): that is retried until `timeout`.
    """
    deadline = time.monotonic() + timeout
    with _admin(bootstrap) as admin:
        known = set(admin.list_topics())
        names = [str(t) for t in topics if str(t) in known]
        if not names:
            return {}
        parts = [TopicPartition(t["name"], p["partition_index"])
                 for t in admin.describe_topics(names) for p in t["partitions"]]
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in parts})
        starts = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in parts})
        while True:
            try:
                committed = admin.list_group_offsets({group: parts})[group]
                break
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    result: dict[TP, tuple[int, int]] = {}
    for tp in sorted(parts):
        done = committed.get(tp)
        position = done.offset if done is not None and done.offset >= 0 else starts[tp].offset
        result[(tp.topic, tp.partition)] = (position, ends[tp].offset)
    return result


def lag(bootstrap: str, group: str, topics: Iterable[str], timeout: float = 10.0) -> dict[str, dict[int, int]]:
    """Messages not yet committed by `group`, per topic and partition."""
    result: dict[str, dict[int, int]] = {}
    for (topic, partition), (position, end) in positions(bootstrap, group, topics, timeout).items():
        result.setdefault(topic, {})[partition] = max(0, end - position)
    return result
