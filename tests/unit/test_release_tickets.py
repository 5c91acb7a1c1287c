"""Release tickets (libs/rpc/tickets.py): only clustermgr's private key mints one, and one ticket releases one
chunk of one blobnode, until it expires."""

from __future__ import annotations

import base64

import pytest

from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import tickets
from blobstore_server.libs.rpc.errors import Forbidden, TicketRefused
from blobstore_server.libs.rpc.tickets import Gate, Minter

SECRET = "11" * 32
OTHER_SECRET = "22" * 32
HOST, DISK, VUID = "http://127.0.0.1:9100", 3, (7 << 32) | (2 << 24) | 1
NOW = 1_700_000_000.0


def minter(secret: str = SECRET, at: float = NOW) -> Minter:
    return Minter(tickets.signing_key(secret), clock=lambda: at)


def gate(*secrets: str, host: str = HOST, at: float = NOW) -> Gate:
    return Gate([tickets.public_key(tickets.signing_key(s)) for s in secrets or (SECRET,)], host, clock=lambda: at)


def test_a_ticket_releases_the_chunk_it_names() -> None:
    gate().check(minter().mint(HOST, DISK, VUID), DISK, VUID)


def test_the_keys_derive_from_the_secret_and_the_public_one_is_not_the_private_one() -> None:
    assert tickets.signing_key(SECRET) == tickets.signing_key(SECRET) != tickets.signing_key(OTHER_SECRET)
    assert tickets.public_key(tickets.signing_key(SECRET)) != tickets.signing_key(SECRET)


@pytest.mark.parametrize(("host", "disk_id", "vuid"), [
    (HOST, DISK, VUID + 1),                      # another vuid (another epoch of the unit)
    (HOST, DISK + 1, VUID),                      # another disk
    ("http://127.0.0.1:9101", DISK, VUID),       # another blobnode (another cluster's disk of the same id)
])
def test_a_ticket_for_another_chunk_is_refused(host: str, disk_id: int, vuid: int) -> None:
    ticket = minter().mint(host, disk_id, vuid)
    with pytest.raises(TicketRefused, match="not clustermgr's"):
        gate().check(ticket, DISK, VUID)


def test_an_expired_ticket_is_refused_and_a_fresh_one_until_its_deadline_is_not() -> None:
    ticket = minter().mint(HOST, DISK, VUID)
    gate(at=NOW + tickets.TTL).check(ticket, DISK, VUID)
    with pytest.raises(TicketRefused, match="expired"):
        gate(at=NOW + tickets.TTL + 1).check(ticket, DISK, VUID)


def test_a_ticket_reaching_too_far_ahead_is_refused() -> None:
    ticket = Minter(tickets.signing_key(SECRET), ttl=tickets.MAX_AHEAD + 10, clock=lambda: NOW).mint(HOST, DISK, VUID)
    with pytest.raises(TicketRefused, match="ahead"):
        gate().check(ticket, DISK, VUID)


def test_a_ticket_of_another_key_is_refused() -> None:
    with pytest.raises(TicketRefused, match="not clustermgr's"):
        gate().check(minter(OTHER_SECRET).mint(HOST, DISK, VUID), DISK, VUID)


def test_a_rotations_previous_key_is_taken() -> None:
    gate(OTHER_SECRET, SECRET).check(minter(SECRET).mint(HOST, DISK, VUID), DISK, VUID)


def test_a_forged_ticket_is_refused() -> None:
    version, expires, signature = minter().mint(HOST, DISK, VUID).split(".")
    later = f"{version}.{int(expires) + 60}.{signature}"  # a deadline moved under a good signature
    flipped = bytearray(base64.urlsafe_b64decode(signature))
    flipped[0] ^= 1
    altered = f"{version}.{expires}.{base64.urlsafe_b64encode(bytes(flipped)).decode()}"
    zeros = f"{version}.{expires}.{base64.urlsafe_b64encode(bytes(64)).decode()}"
    for forged in (later, altered, zeros):
        with pytest.raises(TicketRefused, match="not clustermgr's"):
            gate().check(forged, DISK, VUID)


def test_an_hmac_holder_cannot_mint_one() -> None:
    """What a blobnode holds (the public key, the capability keys) signs nothing a gate takes."""
    public = tickets.public_key(tickets.signing_key(SECRET))
    with pytest.raises(TicketRefused):
        gate().check(Minter(public, clock=lambda: NOW).mint(HOST, DISK, VUID), DISK, VUID)


@pytest.mark.parametrize("ticket", [
    "", "v1", "v1..", "v2.1700000100." + "A" * 86, "v1.soon." + "A" * 86, "v1.1700000100.not*base64!",
    "v1.1700000100." + base64.urlsafe_b64encode(bytes(32)).decode(), "v1.-5." + "A" * 86,
    "v1.\u00b2." + "A" * 86, "v1.1700000100." + "A" * 200,
])
def test_a_malformed_ticket_is_refused(ticket: str) -> None:
    with pytest.raises(TicketRefused):
        gate().check(ticket, DISK, VUID)


def test_without_a_ticket_a_gate_with_a_key_refuses() -> None:
    with pytest.raises(TicketRefused, match="takes a release ticket"):
        gate().check(None, DISK, VUID)


def test_a_gate_with_auth_but_no_key_refuses_every_release() -> None:
    with pytest.raises(TicketRefused, match="no release ticket key"):
        Gate([], HOST, clock=lambda: NOW).check(minter().mint(HOST, DISK, VUID), DISK, VUID)


def test_a_gate_without_auth_lets_every_release_go() -> None:
    Gate(None, HOST).check(None, DISK, VUID)


def test_a_refusal_is_a_403() -> None:
    assert issubclass(TicketRefused, Forbidden) and TicketRefused.status == 403


def test_a_vuid_object_and_its_int_name_the_same_chunk() -> None:
    vuid = Vuid.make(7, 2, 1)
    gate().check(minter().mint(HOST, DISK, vuid), DISK, int(vuid))
