"""The cluster's Kafka users (SASL/SCRAM-SHA-512) and what each may do (ACLs); passwords derive from the secret.

Derived rather than generated, as the Redis password (cluster/redis_auth.py) and the role keys are, so
`deploy render` gives every host's bundle the same ones without storing one more secret. Messages are sealed
already (libs/mq/seal.py); this is defence in depth: without a login a client gets nothing, and a service's
login lets it do only its part:

    admin    super user: the brokers among themselves, the launcher (ACLs), the operator's tools
    mqproxy  creates the topics (ensure_topics) and writes the queued repairs and deletes
    tinker   reads its pipelines' topics in its groups; writes the failed and retry topics
    backlog  reads the topics and the groups' offsets (lag, the Spark backlog job): writes nothing
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from confluent_kafka import admin as kafka_admin
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from blobstore_server.libs.mq.settings import KafkaAuth, client_auth, java_client_auth
from blobstore_server.libs.mq.topics import ALL_TOPICS, Topic

ADMIN = "admin"
USERS = (ADMIN, "mqproxy", "tinker", "backlog")
MECHANISM = "SCRAM-SHA-512"
MQPROXY_WRITES = (Topic.SHARD_REPAIR, Topic.SHARD_REPAIR_PRIOR, Topic.BLOB_DELETE, Topic.UPLOAD_RECLAIM)
TINKER_WRITES = (Topic.SHARD_REPAIR_FAILED, Topic.BLOB_DELETE_FAILED, Topic.UPLOAD_RECLAIM)


def kafka_password(secret: str, user: str) -> str:
    return hmac.digest(bytes.fromhex(secret), f"blobstore kafka password {user}".encode(), hashlib.sha256).hex()


def kafka_user(secret: str, user: str, ca_file: str | None = None) -> KafkaAuth:
    """The login of `user` (one of USERS), as a service's `kafka_auth` config block holds it; over TLS trusting
    `ca_file` (the cluster CA) when given."""
    if user not in USERS:
        raise ValueError(f"no Kafka user {user!r}: one of {', '.join(USERS)}")
    return KafkaAuth(username=user, password=kafka_password(secret, user), mechanism=MECHANISM, ca_file=ca_file)


def scram_users(secret: str) -> dict[str, str]:
    """user -> password of every user, for the brokers' storage format (--add-scram)."""
    return {user: kafka_password(secret, user) for user in USERS}


# (principal, resource type, name, pattern, operation); resource types and patterns as kafka-acls names them
Acl = tuple[str, str, str, str, str]


def acls(group_prefixes: Iterable[str]) -> list[Acl]:
    """Every ALLOW rule of the non-admin users; tinker's groups are `<prefix>-*` for each of `group_prefixes`."""
    rules: list[Acl] = [("mqproxy", "cluster", "kafka-cluster", "literal", "IDEMPOTENT_WRITE"),
                        ("tinker", "cluster", "kafka-cluster", "literal", "IDEMPOTENT_WRITE")]
    for topic in ALL_TOPICS:
        rules += [("mqproxy", "topic", str(topic), "literal", op) for op in ("CREATE", "DESCRIBE")]
        rules += [("tinker", "topic", str(topic), "literal", "READ"),
                  ("backlog", "topic", str(topic), "literal", "READ")]
    rules += [("mqproxy", "topic", str(t), "literal", "WRITE") for t in MQPROXY_WRITES]
    rules += [("tinker", "topic", str(t), "literal", "WRITE") for t in TINKER_WRITES]
    for prefix in group_prefixes:
        rules += [("tinker", "group", f"{prefix}-", "prefixed", "READ"),
                  ("backlog", "group", f"{prefix}-", "prefixed", "DESCRIBE")]
    return rules


def apply_acls(bootstrap: str, secret: str, group_prefixes: Iterable[str], timeout: float = 30.0,
               ca_file: str | None = None) -> None:
    """Create the ACLs (as admin, over TLS trusting `ca_file` if given) on the running cluster; creating one that
    exists is a no-op."""
    admin = kafka_admin.AdminClient({"bootstrap.servers": bootstrap, "client.id": "blobstore-acls",
                                     **client_auth(kafka_user(secret, ADMIN, ca_file))})
    kinds = {"cluster": ResourceType.BROKER, "topic": ResourceType.TOPIC, "group": ResourceType.GROUP}  # Kafka's
    # CLUSTER resource has librdkafka's BROKER code (4)
    bindings = [AclBinding(kinds[kind], name, ResourcePatternType[pattern.upper()], f"User:{user}",
                           "*", AclOperation[op], AclPermissionType.ALLOW)
                for user, kind, name, pattern, op in acls(group_prefixes)]
    for future in admin.create_acls(bindings, request_timeout=timeout).values():
        future.result()


def acl_commands(kafka_home: str, bootstrap: str, config: str, group_prefixes: Iterable[str]) -> list[str]:
    """The same rules as kafka-acls.sh lines, for an operator's cluster (`config`: admin's client.properties)."""
    lines = []
    for user, kind, name, pattern, op in acls(group_prefixes):
        target = "--cluster" if kind == "cluster" else f"--{kind} '{name}' --resource-pattern-type {pattern}"
        lines.append(f"{kafka_home}/bin/kafka-acls.sh --bootstrap-server {bootstrap} --command-config {config} "
                     f"--add --allow-principal User:{user} --operation {op.title().replace('_', '')} {target}")
    return lines


def client_properties(secret: str, user: str = ADMIN, ca_file: str | None = None) -> str:
    """A Kafka tool's client.properties logging in as `user` (over TLS, trusting `ca_file`, if given)."""
    return "".join(f"{key}={value}\n" for key, value in java_client_auth(kafka_user(secret, user, ca_file)).items())
