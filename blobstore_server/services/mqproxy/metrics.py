"""mqproxy's figures, read from its publisher's counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from blobstore_server.libs.proto.mqproxy import PublisherStats
from blobstore_server.libs.rpc.metrics import counter


def publisher_figures(stats: PublisherStats) -> Iterator[Metric]:
    yield counter("blobstore_mqproxy_messages_in", "Repair and delete messages received", stats.messages_in)
    yield counter("blobstore_mqproxy_messages_failed", "Messages Kafka did not take", stats.failed)
    yield counter("blobstore_mqproxy_messages_unconfirmed",
                  "Messages answered 503 before Kafka confirmed them (they may still be delivered)", stats.unconfirmed)
    yield counter("blobstore_mqproxy_messages_sent", "Messages Kafka acknowledged, by topic",
                  [((topic,), n) for topic, n in stats.sent.items()], ["topic"])
