"""librdkafka settings every Kafka client of ours shares."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

SHARED: dict[str, Any] = {
    # A request unanswered this long drops its connection and goes again on a new one: after a network cut
    # heals, what was stuck on a dead connection moves within seconds (librdkafka's default is 60 s).
    "socket.timeout.ms": 10_000,
}


class KafkaAuth(BaseModel):
    """A SASL/SCRAM user of the cluster's Kafka (cluster/kafka_auth.py derives them from the cluster secret).
    Absent, a client speaks PLAINTEXT, as to the tests' own broker."""

    username: str
    password: str
    mechanism: str = "SCRAM-SHA-512"


def client_auth(auth: KafkaAuth | None) -> dict[str, Any]:
    """The librdkafka settings that log in as `auth` ({} without it: PLAINTEXT)."""
    if auth is None:
        return {}
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": auth.mechanism,
            "sasl.username": auth.username, "sasl.password": auth.password}
