"""Tickets (libs/rpc/tickets.py): only the deciding service's private key mints one (clustermgr's a release,
the scheduler's a discard, tinker's a delete), and one ticket lets one call go on one chunk of one blobnode (a
discard: under one task token; a delete: of one bid), until it expires. A delete also takes access's intent for
the blob (or the upload's slices) it names."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.messages import DeleteIntent, UploadSlice
from blobstore_server.libs.rpc import tickets
from blobstore_server.libs.rpc.auth import AuthConfig
from blobstore_server.libs.rpc.errors import Forbidden, TicketRefused
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.libs.rpc.tickets import KINDS, Gate, IntentGate, IntentSigner, Kind, Minter

SECRET = "11" * 32
OTHER_SECRET = "22" * 32
HOST, DISK, VUID = "http://127.0.0.1:9100", 3, (7 << 32) | (2 << 24) | 1
SCOPES = {Kind.RELEASE: None, Kind.DISCARD: 5, Kind.DELETE: 1234}  # a release names the chunk only
NOW = 1_700_000_000.0
TICKETS = [Kind.RELEASE, Kind.DISCARD, Kind.DELETE]  # an intent names blobs, not a chunk (its tests below)
EACH = pytest.mark.parametrize("kind", TICKETS)


def minter(kind: Kind, secret: str = SECRET, at: float = NOW, ttl: float | None = None) -> Minter:
    return Minter(tickets.signing_key(secret, kind), kind, ttl=ttl, clock=lambda: at)


def gate(kind: Kind, *secrets: str, host: str = HOST, at: float = NOW) -> Gate:
    keys = [tickets.public_key(tickets.signing_key(s, kind)) for s in secrets or (SECRET,)]
    return Gate(keys, host, kind, clock=lambda: at)


def mint(kind: Kind, secret: str = SECRET, host: str = HOST, disk_id: int = DISK, vuid: int = VUID,
         scope: int | None = None) -> str:
    return minter(kind, secret).mint(host, disk_id, vuid, SCOPES[kind] if scope is None else scope)


def check(kind: Kind, ticket: str | None, g: Gate | None = None) -> None:
    (g or gate(kind)).check(ticket, DISK, VUID, SCOPES[kind])


@EACH
def test_a_ticket_lets_the_call_it_names_go(kind: Kind) -> None:
    check(kind, mint(kind))


def test_the_keys_derive_from_the_secret_one_per_kind_and_the_public_one_is_not_the_private_one() -> None:
    keys = {tickets.signing_key(SECRET, kind) for kind in Kind}
    assert len(keys) == len(Kind) and tickets.signing_key(SECRET, Kind.DELETE) in keys
    assert tickets.signing_key(SECRET, Kind.RELEASE) != tickets.signing_key(OTHER_SECRET, Kind.RELEASE)
    assert all(tickets.public_key(key) != key for key in keys)


def test_a_release_ticket_is_what_it_was_before_discard_and_delete_tickets() -> None:
    """A clustermgr and a blobnode of different versions (a rolling upgrade) still agree on release tickets."""
    seed = hmac.new(bytes.fromhex(SECRET), b"blobstore release ticket", hashlib.sha256).digest()
    expires = int(NOW) + 60
    signature = Ed25519PrivateKey.from_private_bytes(seed).sign(
        f"blobstore release ticket v1\n{HOST}\n{DISK}\n{VUID}\n{expires}".encode())
    check(Kind.RELEASE, f"v1.{expires}.{base64.urlsafe_b64encode(signature).decode()}")


@pytest.mark.parametrize(("kind", "other"), [
    (kind, other) for kind in TICKETS for other in ("host", "disk", "vuid", "scope")
    if other != "scope" or KINDS[kind].scope is not None])  # a release names the chunk only
def test_a_ticket_for_another_target_is_refused(kind: Kind, other: str) -> None:
    scope = SCOPES[kind]
    ticket = mint(kind, host="http://127.0.0.1:9101" if other == "host" else HOST,  # another cluster's same disk id
                  disk_id=DISK + (other == "disk"), vuid=VUID + (other == "vuid"),  # another epoch of the unit
                  scope=None if scope is None else scope + (other == "scope"))  # another task token, another bid
    with pytest.raises(TicketRefused, match=f"not {KINDS[kind].minter}'s"):
        check(kind, ticket)


@pytest.mark.parametrize(("kind", "made_for"), [(k, m) for k in TICKETS for m in TICKETS if k != m])
def test_a_ticket_of_another_kind_is_refused(kind: Kind, made_for: Kind) -> None:
    """A release ticket does not discard, a discard ticket does not delete, even with the same numbers."""
    ticket = minter(made_for).mint(HOST, DISK, VUID, SCOPES[kind])
    with pytest.raises(TicketRefused):
        check(kind, ticket)


@EACH
def test_an_expired_ticket_is_refused_and_a_fresh_one_until_its_deadline_is_not(kind: Kind) -> None:
    ticket, ttl = mint(kind), KINDS[kind].ttl
    check(kind, ticket, gate(kind, at=NOW + ttl))
    with pytest.raises(TicketRefused, match="expired"):
        check(kind, ticket, gate(kind, at=NOW + ttl + 1))


@EACH
def test_a_ticket_reaching_too_far_ahead_is_refused(kind: Kind) -> None:
    ticket = minter(kind, ttl=KINDS[kind].max_ahead + 10).mint(HOST, DISK, VUID, SCOPES[kind])
    with pytest.raises(TicketRefused, match="ahead"):
        check(kind, ticket)


@EACH
def test_a_ticket_of_another_key_is_refused(kind: Kind) -> None:
    with pytest.raises(TicketRefused, match=f"not {KINDS[kind].minter}'s"):
        check(kind, mint(kind, OTHER_SECRET))


@EACH
def test_a_rotations_previous_key_is_taken(kind: Kind) -> None:
    check(kind, mint(kind, SECRET), gate(kind, OTHER_SECRET, SECRET))


@EACH
def test_a_forged_ticket_is_refused(kind: Kind) -> None:
    version, expires, signature = mint(kind).split(".")
    later = f"{version}.{int(expires) + 60}.{signature}"  # a deadline moved under a good signature
    flipped = bytearray(base64.urlsafe_b64decode(signature))
    flipped[0] ^= 1
    altered = f"{version}.{expires}.{base64.urlsafe_b64encode(bytes(flipped)).decode()}"
    zeros = f"{version}.{expires}.{base64.urlsafe_b64encode(bytes(64)).decode()}"
    for forged in (later, altered, zeros):
        with pytest.raises(TicketRefused, match=f"not {KINDS[kind].minter}'s"):
            check(kind, forged)


@EACH
def test_a_public_key_holder_cannot_mint_one(kind: Kind) -> None:
    """What a blobnode holds (the public keys, the capability keys) signs nothing a gate takes."""
    public = tickets.public_key(tickets.signing_key(SECRET, kind))
    with pytest.raises(TicketRefused):
        check(kind, Minter(public, kind, clock=lambda: NOW).mint(HOST, DISK, VUID, SCOPES[kind]))


@pytest.mark.parametrize("ticket", [
    "", "v1", "v1..", "v2.1700000100." + "A" * 86, "v1.soon." + "A" * 86, "v1.1700000100.not*base64!",
    "v1.1700000100." + base64.urlsafe_b64encode(bytes(32)).decode(), "v1.-5." + "A" * 86,
    "v1.\u00b2." + "A" * 86, "v1.1700000100." + "A" * 200,
])
@EACH
def test_a_malformed_ticket_is_refused(kind: Kind, ticket: str) -> None:
    with pytest.raises(TicketRefused):
        check(kind, ticket)


@EACH
def test_without_a_ticket_a_gate_with_a_key_refuses(kind: Kind) -> None:
    with pytest.raises(TicketRefused, match=f"takes a {kind} ticket from {KINDS[kind].minter}"):
        check(kind, None)


@EACH
def test_a_gate_with_auth_but_no_key_refuses_every_call(kind: Kind) -> None:
    empty = Gate([], HOST, kind, clock=lambda: NOW)
    assert empty.enforced
    with pytest.raises(TicketRefused, match=f"no {kind} ticket key"):
        check(kind, mint(kind), empty)


@EACH
def test_a_gate_without_auth_lets_every_call_go(kind: Kind) -> None:
    open_gate = Gate(None, HOST, kind)
    assert not open_gate.enforced
    check(kind, None, open_gate)


def test_a_refusal_is_a_403() -> None:
    assert issubclass(TicketRefused, Forbidden) and TicketRefused.status == 403


@EACH
def test_a_vuid_object_and_its_int_name_the_same_chunk(kind: Kind) -> None:
    vuid = Vuid.make(7, 2, 1)
    gate(kind).check(minter(kind).mint(HOST, DISK, vuid, SCOPES[kind]), DISK, int(vuid), SCOPES[kind])


def test_a_blobnode_config_of_before_lists_its_release_keys_only_and_takes_no_other_kind() -> None:
    public = tickets.public_key(tickets.signing_key(SECRET, Kind.RELEASE))
    config = AuthConfig.model_validate({"keys": {"observe": "00" * 32}, "ticket_public_keys": [public]})
    assert config.ticket_public_keys == {Kind.RELEASE: [public]}
    assert config.ticket_public_keys.get(Kind.DISCARD, []) == []  # what the blobnode's discard gate gets: refuses


def test_a_minter_holds_its_kinds_key_and_one_without_mints_nothing() -> None:
    config = AuthConfig.for_capabilities(SECRET, [Capability.OBSERVE], mints=Kind.DELETE)
    held = config.minter(Kind.DELETE)
    assert held is not None
    gate(Kind.DELETE, at=time.time()).check(held.mint(HOST, DISK, VUID, 1), DISK, VUID, 1)
    assert AuthConfig.for_capabilities(SECRET, [Capability.OBSERVE]).minter(Kind.DELETE) is None


# delete intents

CLUSTER = 3


def intent(vid: int = 7, bid: int = 1234, upload: tuple[UploadSlice, ...] = (), secret: str = SECRET,
           signer: IntentSigner | None = None) -> DeleteIntent:
    signer = signer or IntentSigner(tickets.signing_key(secret, Kind.INTENT), CLUSTER)
    signature = signer.sign(vid, bid, [(s.vid, s.min_bid, s.count) for s in upload])
    return DeleteIntent(vid=vid, bid=bid, upload=upload, signature=signature)


def intents(*secrets: str) -> IntentGate:
    return IntentGate([tickets.public_key(tickets.signing_key(s, Kind.INTENT)) for s in secrets or (SECRET,)], CLUSTER)


def test_an_intent_lets_its_blobs_shards_go_and_no_others() -> None:
    intents().check(intent(), 7, 1234)
    for vid, bid in [(7, 1235), (8, 1234), (7, 1233)]:
        with pytest.raises(TicketRefused, match="does not cover"):
            intents().check(intent(), vid, bid)


def test_an_uploads_intent_covers_every_blob_of_its_slices_and_no_other() -> None:
    upload = (UploadSlice(vid=7, min_bid=100, count=3), UploadSlice(vid=9, min_bid=500, count=1))
    for vid, bid in [(7, 100), (7, 102), (9, 500)]:
        intents().check(intent(7, 100, upload), vid, bid)
    for vid, bid in [(7, 103), (7, 99), (9, 501), (8, 100)]:
        with pytest.raises(TicketRefused, match="does not cover"):
            intents().check(intent(7, 100, upload), vid, bid)


def test_an_intent_whose_blobs_were_changed_after_signing_is_refused() -> None:
    """Whoever carries it (tinker, Kafka) cannot stretch an intent to other blobs: the signature covers them."""
    signed = intent(7, 100, (UploadSlice(vid=7, min_bid=100, count=1),))
    stretched = signed.model_copy(update={"upload": (UploadSlice(vid=7, min_bid=100, count=1000),)})
    with pytest.raises(TicketRefused, match="is not access's"):
        intents().check(stretched, 7, 500)
    moved = signed.model_copy(update={"vid": 8, "upload": ()})
    with pytest.raises(TicketRefused, match="is not access's"):
        intents().check(moved, 8, 100)


def test_an_intent_of_another_key_or_kind_is_refused_and_a_rotations_previous_is_taken() -> None:
    with pytest.raises(TicketRefused, match="is not access's"):
        intents().check(intent(secret=OTHER_SECRET), 7, 1234)
    intents(OTHER_SECRET, SECRET).check(intent(), 7, 1234)
    tinkers = IntentSigner(tickets.signing_key(SECRET, Kind.DELETE), CLUSTER)  # tinker's own key signs no intent
    with pytest.raises(TicketRefused, match="is not access's"):
        intents().check(intent(signer=tinkers), 7, 1234)


@pytest.mark.parametrize("signature", ["", "v1", "v2.AAAA", "v1.!!", "v1." + "A" * 120])
def test_a_malformed_or_missing_intent_is_refused(signature: str) -> None:
    with pytest.raises(TicketRefused):
        intents().check(DeleteIntent(vid=7, bid=1234, signature=signature), 7, 1234)
    with pytest.raises(TicketRefused, match="takes the delete intent access signed"):
        intents().check(None, 7, 1234)


def test_an_intent_gate_with_auth_but_no_key_deletes_nothing_and_without_auth_everything() -> None:
    with pytest.raises(TicketRefused, match="no delete intent key"):
        IntentGate([], CLUSTER).check(intent(), 7, 1234)
    IntentGate(None, CLUSTER).check(None, 7, 1234)


def test_access_holds_the_intent_key_and_signs_what_a_blobnode_takes() -> None:
    config = AuthConfig.for_capabilities(SECRET, [Capability.OBSERVE], mints=Kind.INTENT)
    signer = config.intents(CLUSTER)
    assert signer is not None
    intents().check(intent(signer=signer), 7, 1234)
    assert AuthConfig.for_capabilities(SECRET, [Capability.OBSERVE]).intents(CLUSTER) is None


def test_an_intent_of_another_cluster_of_the_region_is_refused() -> None:
    """A region's clusters share access's key and Kafka, and repeat each other's vids and bids: an intent one of
    them saw deletes nothing in another."""
    other = IntentSigner(tickets.signing_key(SECRET, Kind.INTENT), CLUSTER + 1)
    with pytest.raises(TicketRefused, match=f"is not access's for cluster {CLUSTER}"):
        intents().check(intent(signer=other), 7, 1234)
