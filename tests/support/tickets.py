"""What a process's `auth` holds of ticket keys (libs/rpc/tickets.py), and tickets minted as their deciders do."""

from __future__ import annotations

from blobstore_server.cluster.plan import MINTS
from blobstore_server.libs.rpc import tickets
from blobstore_server.libs.rpc.tickets import Kind, Minter


def ticket_keys(secret: str, role: str) -> tuple[str | None, dict[str, list[str]]]:
    """(the private key a `role` process holds, the public keys of each kind): a minter its own kind's private
    key only, a blobnode every kind's public key only, any other process neither."""
    signing = tickets.signing_key(secret, MINTS[role]) if role in MINTS else None
    public = {str(kind): [tickets.public_key(tickets.signing_key(secret, kind))] for kind in Kind}
    return signing, public if role == "blobnode" else {}


def minter(secret: str, kind: Kind, ttl: float | None = None) -> Minter:
    """The minter of `kind` tickets the decider of a cluster with `secret` holds."""
    return Minter(tickets.signing_key(secret, kind), kind, ttl=ttl)
