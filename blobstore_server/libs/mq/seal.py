"""Seals on repair and delete messages, so that a Kafka writer alone cannot have tinker delete a blob.

The producer (mqproxy, and tinker re-publishing a failed message) computes an HMAC-SHA256 with the cluster's
message key over the topic and the record's value; tinker verifies it before acting and skips a message whose
seal is missing or wrong. I/O-free: the callers pass bytes and headers in and out.

Format: the seal travels in a Kafka record header, `blobstore-seal: v1:<hex HMAC>`, and the value stays the
very JSON it was. Why a header rather than an envelope around the value:
- every other reader of these topics keeps working unchanged: the Spark backlog job parses values with
  `from_json` (Spark's Kafka source hands out headers only when asked), `kafka-console-consumer` and the
  benches print the same JSON, and a consumer that does not verify needs no new parsing;
- an unsealed message (a cluster without a message key, or records written before the key existed) has the
  same shape as a sealed one, so turning sealing on needs no migration of what is queued.
What is MACed: a version tag, the topic and the value. The topic is bound so a sealed record copied to another
topic (a delete into the reclaim topic, whose handling differs) does not verify there; the value carries the
cluster id, so a message of another cluster sharing the Kafka, sealed with that cluster's key, never verifies
here either. A genuine record replayed on its own topic still verifies: deletes and repairs are idempotent
(deleting a deleted blob, repairing a present shard, change nothing), which is why no nonce is kept.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from blobstore_server.libs.mac import hmac_sha256

SEAL_HEADER = "blobstore-seal"
VERSION = b"v1"
Headers = Iterable[tuple[str, bytes | str | None]]


class Forged(Exception):
    """The record has no seal, or one this key did not make: it must not be acted upon."""


def message_key(secret: str) -> bytes:
    """The cluster's message key, derived from its (hex) secret as the role keys are; held by mqproxy and
    tinker only, so the services that merely talk to them cannot seal a message."""
    return hmac.digest(bytes.fromhex(secret), b"blobstore message key", hashlib.sha256)


def _mac(key: bytes, topic: str, value: bytes) -> bytes:
    text = b"\0".join((b"blobstore seal " + VERSION, topic.encode(), value))
    return hmac_sha256(key, text)


def seal(key: bytes, topic: str, value: bytes) -> bytes:
    """The header value sealing `value` on `topic`."""
    return VERSION + b":" + _mac(key, topic, value).hex().encode()


def seal_headers(key: bytes, topic: str, value: bytes) -> list[tuple[str, str | bytes | None]]:
    """The headers to produce the record with (typed as librdkafka takes them)."""
    return [(SEAL_HEADER, seal(key, topic, value))]


def unseal(key: bytes, topic: str, value: bytes, headers: Headers | None) -> bytes:
    """`value` when exactly one seal header is present and was made with `key` for this topic and value;
    raises `Forged` otherwise (no seal, two seals, an unknown version, a wrong MAC)."""
    seals = [v for name, v in headers or () if name == SEAL_HEADER]
    if not seals:
        raise Forged("no seal")
    if len(seals) > 1:
        raise Forged("more than one seal")
    raw = seals[0]
    given = raw.encode() if isinstance(raw, str) else raw or b""
    version, _, mac = given.partition(b":")
    if version != VERSION:
        raise Forged(f"unknown seal version {version[:8]!r}")
    if not hmac.compare_digest(mac, _mac(key, topic, value).hex().encode()):
        raise Forged("wrong seal")
    return value
