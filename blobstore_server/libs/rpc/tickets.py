"""Release tickets: clustermgr's signed word that a chunk may go. I/O-free.

Capability keys are symmetric (libs/rpc/auth.py): whoever verifies a `chunk` signature can make one, so every
blobnode could release any chunk on every other. A release therefore also takes a ticket: an Ed25519 signature
by clustermgr, made only once it decided in the Raft log's order that the unit is no volume's live unit (a
scheduler's `/volume/unit/release`, or its own roll back of a volume never committed). Clustermgr alone holds the
private key; a blobnode holds the public one, which verifies and cannot mint.

A ticket binds one chunk: the advertised host of the blobnode that holds it (clustermgr's record of the disk's
owner, so a ticket of one cluster of a region, whose disk ids and vids repeat, is worth nothing on another), the
disk, the vuid (whose epoch is never issued again once dead) and a deadline. Its text is
`v1.<expires>.<signature, urlsafe base64>`: the blobnode rebuilds what was signed from its own host and the
request's disk and vuid, so a ticket for anything else fails the signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from blobstore_server.libs.rpc.errors import TicketRefused

VERSION = "v1"
TTL = 300.0  # seconds a ticket stays good: a release follows its ticket at once, a retry asks for a new one
MAX_AHEAD = 3600.0  # a blobnode takes no ticket reaching further ahead of its clock (none of ours does)
MAX_TEXT = 128  # a ticket's text is ~100 characters


def signing_key(secret: str) -> str:
    """Clustermgr's private key (hex of the 32-byte Ed25519 seed), derived from the cluster secret so every
    rendering of a cluster gives the same one."""
    return hmac.new(bytes.fromhex(secret), b"blobstore release ticket", hashlib.sha256).hexdigest()


def public_key(signing: str) -> str:
    """The public key (hex, 32 bytes) of `signing_key`'s key: what a blobnode holds."""
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(signing)).public_key().public_bytes_raw().hex()


def _signed(host: str, disk_id: int, vuid: int, expires: int) -> bytes:
    # int(): a `Vuid` (an int) prints as its parts
    return f"blobstore release ticket {VERSION}\n{host}\n{int(disk_id)}\n{int(vuid)}\n{int(expires)}".encode()


class Minter:
    """Clustermgr's side: a ticket for the chunk of `vuid` on `disk_id`, held by the blobnode advertised as
    `host`. Call it only once the log said the unit is dead."""

    def __init__(self, signing: str, ttl: float = TTL, clock: Callable[[], float] = time.time) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(signing))
        self.ttl = ttl
        self.clock = clock

    def mint(self, host: str, disk_id: int, vuid: int) -> str:
        expires = int(self.clock() + self.ttl)
        signature = self._key.sign(_signed(host, disk_id, vuid, expires))
        return f"{VERSION}.{expires}.{base64.urlsafe_b64encode(signature).decode()}"


class Gate:
    """A blobnode's side: whether a release of the chunk of `vuid` on `disk_id` here (advertised as `host`) may
    go. `public_keys` None: this blobnode runs without auth (`insecure`), every release goes, as every route is
    open; empty: it has auth but no ticket key, so it releases nothing (never a silent open door); else a valid
    ticket of one of them (current, then a rotation's previous) is needed."""

    def __init__(self, public_keys: Sequence[str] | None, host: str, clock: Callable[[], float] = time.time) -> None:
        self._keys = None if public_keys is None else [
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(key)) for key in public_keys]
        self.host = host
        self.clock = clock

    def check(self, ticket: str | None, disk_id: int, vuid: int) -> None:
        """TicketRefused saying why, unless the release may go."""
        if self._keys is None:
            return
        if not self._keys:
            raise TicketRefused("this blobnode has auth but no release ticket key (auth.ticket_public_keys): it "
                                "releases no chunk")
        if not ticket:
            raise TicketRefused(f"releasing chunk {vuid} on disk {disk_id} takes a release ticket from clustermgr")
        expires, signature = _parse(ticket)
        now = self.clock()
        if expires < now:
            raise TicketRefused(f"the release ticket expired {now - expires:.0f}s ago")
        if expires > now + MAX_AHEAD:
            raise TicketRefused(f"a release ticket may reach {MAX_AHEAD:.0f}s ahead, not {expires - now:.0f}s")
        signed = _signed(self.host, disk_id, vuid, expires)
        for key in self._keys:
            try:
                key.verify(signature, signed)
                return
            except InvalidSignature:
                continue
        raise TicketRefused(f"the release ticket is not clustermgr's for chunk {vuid} on disk {disk_id} of "
                            f"{self.host}")


def _parse(ticket: str) -> tuple[int, bytes]:
    version, _, rest = ticket.partition(".")
    text, _, encoded = rest.partition(".")
    if version != VERSION or not (text.isascii() and text.isdigit()) or len(ticket) > MAX_TEXT:
        raise TicketRefused(f"malformed release ticket (want {VERSION}.<expires>.<signature>)")
    try:
        signature = base64.urlsafe_b64decode(encoded.encode())
    except (binascii.Error, ValueError):
        raise TicketRefused("malformed release ticket: its signature is not base64") from None
    if len(signature) != 64:
        raise TicketRefused("malformed release ticket: an Ed25519 signature has 64 bytes")
    return int(text), signature
