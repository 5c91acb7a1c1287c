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
    # The CA (PEM file) the brokers' certificates chain to: with it the login goes over TLS (SASL_SSL), so neither
    # the messages nor the SCRAM exchange cross the network in clear; None: SASL_PLAINTEXT (a local cluster)
    ca_file: str | None = None

    @property
    def protocol(self) -> str:
        return "SASL_SSL" if self.ca_file else "SASL_PLAINTEXT"


def client_auth(auth: KafkaAuth | None) -> dict[str, Any]:
    """The librdkafka settings that log in as `auth` ({} without it: PLAINTEXT). librdkafka checks the broker's
    certificate against `ca_file` and its address (the certificates name each host's IP)."""
    if auth is None:
        return {}
    tls = {"ssl.ca.location": auth.ca_file} if auth.ca_file else {}
    return {"security.protocol": auth.protocol, "sasl.mechanism": auth.mechanism,
            "sasl.username": auth.username, "sasl.password": auth.password, **tls}


def java_client_auth(auth: KafkaAuth) -> dict[str, str]:
    """The same login as settings of Kafka's Java client (the bundle's tools, Spark's Kafka source)."""
    tls = {"ssl.truststore.type": "PEM", "ssl.truststore.location": auth.ca_file} if auth.ca_file else {}
    return {"security.protocol": auth.protocol, "sasl.mechanism": auth.mechanism,
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                                f'username="{auth.username}" password="{auth.password}";', **tls}


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
