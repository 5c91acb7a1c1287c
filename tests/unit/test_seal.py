"""Seals on Kafka messages (libs/mq/seal.py): only the cluster's producers make one that verifies."""

from __future__ import annotations

import pytest

from blobstore_server.libs.mq.seal import SEAL_HEADER, Forged, message_key, seal, seal_headers, unseal
from blobstore_server.libs.mq.topics import Topic
from blobstore_server.libs.proto.messages import DeleteMsg
from blobstore_server.libs.rpc.auth import new_secret

SECRET = new_secret()
KEY = message_key(SECRET)
VALUE = DeleteMsg(cluster_id=1, vid=7, bid=42, time=1.0).to_bytes()
TOPIC = str(Topic.BLOB_DELETE)


def test_a_good_seal_gives_the_value_back_and_keeps_it_plain_json() -> None:
    headers = seal_headers(KEY, TOPIC, VALUE)
    assert unseal(KEY, TOPIC, VALUE, headers) == VALUE
    assert DeleteMsg.model_validate_json(VALUE).bid == 42  # the value itself is untouched
    assert headers == [(SEAL_HEADER, seal(KEY, TOPIC, VALUE))]
    assert seal(KEY, TOPIC, VALUE).startswith(b"v1:") and len(seal(KEY, TOPIC, VALUE)) == 3 + 64


def test_the_key_is_derived_per_secret_and_stable() -> None:
    assert message_key(SECRET) == KEY and len(KEY) == 32
    assert message_key(new_secret()) != KEY


@pytest.mark.parametrize("where", range(0, len(VALUE), 7))
def test_a_flipped_byte_of_the_value_is_forged(where: int) -> None:
    altered = bytearray(VALUE)
    altered[where] ^= 0x01
    with pytest.raises(Forged, match="wrong seal"):
        unseal(KEY, TOPIC, bytes(altered), seal_headers(KEY, TOPIC, VALUE))


def test_a_flipped_byte_of_the_seal_is_forged() -> None:
    mac = bytearray(seal(KEY, TOPIC, VALUE))
    mac[10] = ord("0") if mac[10] != ord("0") else ord("1")
    with pytest.raises(Forged):
        unseal(KEY, TOPIC, VALUE, [(SEAL_HEADER, bytes(mac))])


def test_a_wrong_key_is_forged() -> None:
    with pytest.raises(Forged, match="wrong seal"):
        unseal(KEY, TOPIC, VALUE, seal_headers(b"\0" * 32, TOPIC, VALUE))


def test_a_seal_from_another_cluster_is_forged() -> None:
    other = message_key(new_secret())  # its own secret, sharing our Kafka
    with pytest.raises(Forged):
        unseal(KEY, TOPIC, VALUE, seal_headers(other, TOPIC, VALUE))


def test_a_seal_made_for_another_topic_is_forged() -> None:
    with pytest.raises(Forged):
        unseal(KEY, str(Topic.UPLOAD_RECLAIM), VALUE, seal_headers(KEY, TOPIC, VALUE))


@pytest.mark.parametrize("headers", [None, [], [("other", b"x")], [(SEAL_HEADER, None)], [(SEAL_HEADER, b"")],
                                     [(SEAL_HEADER, b"v2:" + b"0" * 64)]])
def test_a_missing_or_unreadable_seal_is_forged(headers: list[tuple[str, bytes | None]] | None) -> None:
    with pytest.raises(Forged):
        unseal(KEY, TOPIC, VALUE, headers)


def test_two_seals_are_forged_even_if_one_is_good() -> None:
    good = seal(KEY, TOPIC, VALUE)
    with pytest.raises(Forged, match="more than one"):
        unseal(KEY, TOPIC, VALUE, [(SEAL_HEADER, good), (SEAL_HEADER, good)])


def test_a_header_given_as_text_verifies() -> None:
    assert unseal(KEY, TOPIC, VALUE, [(SEAL_HEADER, seal(KEY, TOPIC, VALUE).decode())]) == VALUE
