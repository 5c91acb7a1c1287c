"""librdkafka settings every Kafka client of ours shares."""

from __future__ import annotations

from typing import Any

SHARED: dict[str, Any] = {
    # A request unanswered this long drops its connection and goes again on a new one: after a network cut
    # heals, what was stuck on a dead connection moves within seconds (librdkafka's default is 60 s).
    "socket.timeout.ms": 10_000,
}
