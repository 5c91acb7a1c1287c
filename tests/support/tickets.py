"""What a process's `auth` holds of ticket keys (libs/rpc/tickets.py), and tickets minted as their deciders do."""

from __future__ import annotations

import json
from typing import Any

import httpx

from blobstore_server.cluster.plan import MINTS
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.messages import DeleteIntent
from blobstore_server.libs.proto.routes import CATALOG
from blobstore_server.libs.rpc import tickets
from blobstore_server.libs.rpc.auth import AUTH_HEADER, AuthConfig, Signer
from blobstore_server.libs.rpc.tickets import IntentSigner, Kind, Minter
from tests.support.processes import TEST_SECRET


def ticket_keys(secret: str, role: str) -> tuple[str | None, dict[str, list[str]]]:
    """(the private key a `role` process holds, the public keys of each kind): a minter its own kind's private
    key only, a blobnode every kind's public key only, any other process neither."""
    signing = tickets.signing_key(secret, MINTS[role]) if role in MINTS else None
    public = {str(kind): [tickets.public_key(tickets.signing_key(secret, kind))] for kind in tickets.KEYED}
    return signing, public if role == "blobnode" else {}


def minter(secret: str, kind: Kind, ttl: float | None = None) -> Minter:
    """The minter of `kind` tickets the decider of a cluster with `secret` holds."""
    return Minter(tickets.signing_key(secret, kind), kind, ttl=ttl)


def hmac_keys(auth: dict[str, Any]) -> Signer:
    """What a process's leaked `auth` section signs with: its capability keys (a ticket key aside: a blobnode
    trusts a ticket for its minter's private key, which is no HMAC key)."""
    return Signer(AuthConfig.model_validate(auth).keys)


def post_signed(signer: Signer, url: str, body: dict[str, Any], content: bytes | None = None,
                params: dict[str, str] | None = None) -> httpx.Response:
    """POST `body` (JSON) or raw `content` to `url`, signed by `signer` for the route's capability, as any holder of
    that key can (a refusal for a capability the signer lacks is a 403 too)."""
    data = json.dumps(body).encode() if content is None else content
    header = signer.header("POST", url, params, data, CATALOG)
    kind = "application/json" if content is None else "application/octet-stream"
    return httpx.post(url, content=data, params=params, headers={AUTH_HEADER: header, "content-type": kind},
                      timeout=10)


def ticket_refused(answer: httpx.Response, reason: str = "") -> bool:
    return answer.status_code == 403 and "ticket_refused" in answer.text and reason in answer.text


def as_tinker(host: str, disk_id: int, vuid: int, bid: int, secret: str = TEST_SECRET) -> dict[str, Any]:
    """What tinker sends with a mark or a delete for good of a shard of a test's cluster: its delete ticket for the
    shard and access's intent for the blob (as `BlobnodeClient.mark_delete_shard`'s keywords)."""
    return {"ticket": minter(secret, Kind.DELETE).mint(host, disk_id, vuid, bid),
            "intent": delete_intent(Vuid(vuid).vid(), bid, secret)}


def delete_intent(vid: int, bid: int, secret: str = TEST_SECRET, cluster_id: int = 1) -> DeleteIntent:
    """Access's intent to delete blob vid/bid in a test's cluster (a mark and a delete for good take one with
    tinker's ticket)."""
    signer = IntentSigner(tickets.signing_key(secret, Kind.INTENT), cluster_id)
    return DeleteIntent(vid=vid, bid=bid, signature=signer.sign(vid, bid))


def epoch_ticket(epoch: int, secret: str = TEST_SECRET, cluster_id: int = 1) -> str:
    """clustermgr's ticket for scheduler lease `epoch` of a test's cluster, as the scheduler holding that lease gets
    it (`BlobnodeClient`'s `epoch_ticket=`)."""
    minting = Minter(tickets.signing_key(secret, tickets.key_kind(Kind.EPOCH)), Kind.EPOCH)
    return minting.mint(tickets.cluster_host(cluster_id), 0, 0, epoch)
