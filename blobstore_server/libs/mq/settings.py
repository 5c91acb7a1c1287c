"""librdkafka settings every Kafka client of ours shares."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from blobstore_server.libs.rpc.config import ServiceSettings

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


class MessageServiceSettings(ServiceSettings):
    """A service that writes or reads the cluster's repair and delete messages (mqproxy, tinker)."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    # Hex key sealing repair and delete messages (libs/mq/seal.py), derived from the cluster secret; None:
    # messages go unsealed and are accepted unsealed (a cluster run without auth, or `insecure`).
    message_key: str | None = Field(None, pattern="^[0-9a-f]{64}$")
    kafka_auth: KafkaAuth | None = None  # its SASL/SCRAM login (cluster/kafka_auth.py); None: PLAINTEXT

    def open_links(self) -> list[str]:
        return [why for why, is_open in (
            ("repair and delete messages unsealed (no `message_key`): anyone who reaches Kafka can forge a delete",
             self.message_key is None),
            ("Kafka without a login, in clear (no `kafka_auth`)", self.kafka_auth is None)) if is_open]
