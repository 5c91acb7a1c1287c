"""Tickets: the deciding service's signed word that a destructive call on a blobnode may go. I/O-free.

Capability keys are symmetric (libs/rpc/auth.py): whoever verifies a `chunk` or `discard-shard` signature can make
one, so every blobnode (and the worker, access) could destroy data on every other. A destructive call therefore
also takes a ticket: an Ed25519 signature by the one service that decides it (`KINDS`), which alone holds the
private key; a blobnode holds the public keys, which verify and cannot mint.

- release (of a chunk): clustermgr, once it decided in the Raft log's order that the unit is no volume's live unit
  (a scheduler's `/volume/unit/release`, or its own roll back of a volume never committed).
- discard (of a shard, at once): the scheduler, when it hands a task out, for the task's destination unit and the
  hand-out's token. The bids cannot be named then (the worker lists them as it goes, and a PUT in flight adds
  late ones), and need not be: the destination's task fence takes a discard only under that token while the unit
  is filled, and closes for good before it goes live, so the ticket destroys nothing any volume reads.
- delete (the mark of a shard, then its removal for good): tinker, for one blob's shard, when it marks a blob
  whose delete stands and when that delete is past the safe delay (the blobnode holds the removal `delete_hold`
  after the mark besides).
- epoch (of a scheduler's lease, which every chunk change a scheduler sends names): clustermgr, with its release
  key, for the epoch its kv holds in the lease record (which grows by one a takeover). A disk keeps the highest
  epoch it has seen and refuses older ones, so an epoch nobody won, raised by a stolen scheduler key, would fence
  the real scheduler out for good; with the ticket only a committed epoch raises it. It names the cluster, not a
  chunk, and has no deadline that matters (an epoch is current for as long as its holder renews).

- intent (to delete a blob): access, when a user deletes an object, a failed PUT leaves blobs no Location names, or
  a multipart upload is due for its reclaim (and the operator, whose secret derives every key, for a partial delete
  an inspection found). It travels in the delete message (mqproxy, Kafka, tinker) to the blobnode with tinker's
  delete ticket: a mark or a delete for good takes both, so neither tinker's key (the decider of *when*) nor
  access's (the only one that saw the user ask *what*) alone destroys a live shard. It names the cluster and the
  blob (or an upload's slices of blobs), not a chunk: a delete may wait days in Kafka, so it has no deadline (bids
  are never issued twice in a cluster, so it cannot delete another blob; the clusters of a region, which share
  access's key and Kafka and repeat each other's vids and bids, take only their own).

A ticket binds the advertised host of the blobnode (so a ticket of one cluster of a region, whose disk ids and
vids repeat, is worth nothing on another), the disk, the vuid (whose epoch is never issued again once dead), the
kind's scope (discard: the task token; delete: the bid) and a deadline. Its text is `v1.<expires>.<signature,
urlsafe base64>`: the blobnode rebuilds what was signed from its own host and the request's fields, so a ticket
for anything else fails the signature.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from blobstore_server.libs.rpc.errors import TicketRefused

VERSION = "v1"
YEAR = 365 * 86400.0
MAX_TEXT = 128  # a ticket's text is ~100 characters


class Kind(enum.StrEnum):
    RELEASE = "release"
    DISCARD = "discard"
    DELETE = "delete"
    INTENT = "intent"
    EPOCH = "epoch"


@dataclass(frozen=True)
class KindRule:
    minter: str  # the role holding the private key
    scope: str | None  # what besides the chunk a ticket names (None: the chunk is all)
    ttl: float  # seconds a ticket stays good
    max_ahead: float  # a blobnode takes no ticket reaching further ahead of its clock (none of ours does)
    key: Kind | None = None  # the kind whose key signs it (None: its own)


KINDS: dict[Kind, KindRule] = {
    # a release follows its ticket at once; a retry asks for a new one
    Kind.RELEASE: KindRule("clustermgr", None, 300.0, 3600.0),
    # good for a whole task (the fence, not the deadline, ends its use): one that runs longer fails its discard and
    # is handed out again, with a new ticket
    Kind.DISCARD: KindRule("scheduler", "task token", 86400.0, 2 * 86400.0),
    Kind.DELETE: KindRule("tinker", "bid", 300.0, 3600.0),
    Kind.INTENT: KindRule("access", "blob", math.inf, math.inf),  # no deadline (`IntentSigner`)
    Kind.EPOCH: KindRule("clustermgr", "epoch", 100 * YEAR, 200 * YEAR, key=Kind.RELEASE),
}
KEYED = [kind for kind, rule in KINDS.items() if rule.key is None]  # the kinds with a key of their own


def key_kind(kind: Kind) -> Kind:
    """The kind whose key signs `kind` tickets."""
    return KINDS[kind].key or kind


def cluster_host(cluster_id: int) -> str:
    """What a ticket naming a cluster rather than a blobnode (an epoch's) binds in place of the host."""
    return f"cluster {cluster_id}"


def signing_key(secret: str, kind: Kind) -> str:
    """The minter's private key of `kind` (hex of the 32-byte Ed25519 seed), derived from the cluster secret so every
    rendering of a cluster gives the same one."""
    return hmac.new(bytes.fromhex(secret), f"blobstore {kind} ticket".encode(), hashlib.sha256).hexdigest()


def public_key(signing: str) -> str:
    """The public key (hex, 32 bytes) of `signing_key`'s key: what a blobnode holds."""
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(signing)).public_key().public_bytes_raw().hex()


def _signed(kind: Kind, host: str, disk_id: int, vuid: int, scope: int | None, expires: int) -> bytes:
    # int(): a `Vuid` (an int) prints as its parts; a release (no scope) signs what it signed before discards came
    fields = [host, str(int(disk_id)), str(int(vuid)), *([] if scope is None else [str(int(scope))]), str(int(expires))]
    return "\n".join([f"blobstore {kind} ticket {VERSION}", *fields]).encode()


class Minter:
    """The deciding service's side: a ticket of `kind` for the chunk of `vuid` on `disk_id` (and its `scope`), held
    by the blobnode advertised as `host`. Call it only once the decision is made."""

    def __init__(self, signing: str, kind: Kind, ttl: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(signing))
        self.kind = kind
        self.ttl = KINDS[kind].ttl if ttl is None else ttl
        self.clock = clock

    def mint(self, host: str, disk_id: int, vuid: int, scope: int | None = None) -> str:
        expires = int(self.clock() + self.ttl)
        signature = self._key.sign(_signed(self.kind, host, disk_id, vuid, scope, expires))
        return f"{VERSION}.{expires}.{base64.urlsafe_b64encode(signature).decode()}"


class Gate:
    """A blobnode's side: whether a call of `kind` on the chunk of `vuid` on `disk_id` here (advertised as `host`) may
    go. `public_keys` None: this blobnode runs without auth (`insecure`), every call goes, as every route is open;
    empty: it has auth but no key of this kind, so it takes none (never a silent open door); else a valid ticket of
    one of them (current, then a rotation's previous) is needed."""

    def __init__(self, public_keys: Sequence[str] | None, host: str, kind: Kind,
                 clock: Callable[[], float] = time.time) -> None:
        self._keys = None if public_keys is None else [
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(key)) for key in public_keys]
        self.host = host
        self.kind = kind
        self.clock = clock

    @property
    def enforced(self) -> bool:
        """Whether this blobnode runs with auth (a ticket counts)."""
        return self._keys is not None

    def check(self, ticket: str | None, disk_id: int, vuid: int, scope: int | None = None) -> None:
        """TicketRefused saying why, unless the call may go."""
        if self._keys is None:
            return
        rule, what = KINDS[self.kind], f"{self.kind} ticket"
        target = ", ".join([*([f"chunk {vuid} on disk {disk_id}"] if disk_id else []),
                            *([] if rule.scope is None else [f"{rule.scope} {scope}"])])
        if not self._keys:
            raise TicketRefused(f"this blobnode has auth but no {what} key (auth.ticket_public_keys): it takes no "
                                f"{self.kind}")
        if not ticket:
            call = f"a {self.kind} of {target}" if disk_id else f"a change under {target}"
            raise TicketRefused(f"{call} takes {'an' if what[0] in 'aeiou' else 'a'} {what} from {rule.minter}")
        expires, signature = _parse(ticket, what)
        now = self.clock()
        if expires < now:
            raise TicketRefused(f"the {what} expired {now - expires:.0f}s ago")
        if expires > now + rule.max_ahead:
            raise TicketRefused(f"a {what} may reach {rule.max_ahead:.0f}s ahead, not {expires - now:.0f}s")
        if not _verified(self._keys, signature, _signed(self.kind, self.host, disk_id, vuid, scope, expires)):
            raise TicketRefused(f"the {what} is not {rule.minter}'s for {target} of {self.host}")


def _verified(keys: Sequence[Ed25519PublicKey], signature: bytes, signed: bytes) -> bool:
    """Whether one of `keys` (the current one, then a rotation's previous) signed `signed`."""
    for key in keys:
        try:
            key.verify(signature, signed)
            return True
        except InvalidSignature:
            continue
    return False


def _parse(ticket: str, what: str) -> tuple[int, bytes]:
    version, _, rest = ticket.partition(".")
    text, _, encoded = rest.partition(".")
    if version != VERSION or not (text.isascii() and text.isdigit()) or len(ticket) > MAX_TEXT:
        raise TicketRefused(f"malformed {what} (want {VERSION}.<expires>.<signature>)")
    return int(text), _signature(encoded, what)


def _signature(encoded: str, what: str) -> bytes:
    try:
        signature = base64.urlsafe_b64decode(encoded.encode())
    except (binascii.Error, ValueError):
        raise TicketRefused(f"malformed {what}: its signature is not base64") from None
    if len(signature) != 64:
        raise TicketRefused(f"malformed {what}: an Ed25519 signature has 64 bytes")
    return signature


Slice = tuple[int, int, int]  # vid, min_bid, count: a run of an upload's blobs


def _intent_text(cluster_id: int, vid: int, bid: int, upload: Sequence[Slice]) -> bytes:
    slices = ",".join(f"{int(v)}:{int(first)}:{int(count)}" for v, first, count in upload)
    fields = [str(int(cluster_id)), str(int(vid)), str(int(bid)), slices]
    return "\n".join([f"blobstore {Kind.INTENT} {VERSION}", *fields]).encode()


def _covers(vid: int, bid: int, upload: Sequence[Slice], shard_vid: int, shard_bid: int) -> bool:
    """Whether a delete of blob vid/bid (or, for an upload's reclaim, of every blob of its slices) deletes this one."""
    if not upload:
        return (vid, bid) == (shard_vid, shard_bid)
    return any(v == shard_vid and first <= shard_bid < first + count for v, first, count in upload)


class IntentSigner:
    """Access's side (and the operator's): its word that the user (or the inspection) asked to delete blob vid/bid
    of cluster `cluster_id`, or the `upload` slices of an unfinished multipart upload whose first blob is vid/bid."""

    def __init__(self, signing: str, cluster_id: int) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(signing))
        self.cluster_id = cluster_id

    def sign(self, vid: int, bid: int, upload: Sequence[Slice] = ()) -> str:
        signature = self._key.sign(_intent_text(self.cluster_id, vid, bid, upload))
        return f"{VERSION}.{base64.urlsafe_b64encode(signature).decode()}"


class Intent(Protocol):
    """A delete message's intent as a blobnode receives it (`DeleteIntent` in libs/proto/messages.py)."""

    @property
    def vid(self) -> int: ...

    @property
    def bid(self) -> int: ...

    @property
    def signature(self) -> str: ...

    def slices(self) -> list[Slice]: ...


class IntentGate:
    """A blobnode's side: whether a delete intent for a blob (or an upload's) of this blobnode's cluster
    `cluster_id` was signed by access's key (one of `public_keys`, as `Gate`: None, no auth and every call goes;
    empty, none goes) and covers the shard of blob `shard_vid`/`shard_bid`."""

    def __init__(self, public_keys: Sequence[str] | None, cluster_id: int) -> None:
        self._keys = None if public_keys is None else [
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(key)) for key in public_keys]
        self.cluster_id = cluster_id

    def check(self, intent: Intent | None, shard_vid: int, shard_bid: int) -> None:
        """TicketRefused saying why, unless the intent is access's and covers the shard's blob."""
        if self._keys is None:
            return
        what, blob = "delete intent", f"blob {shard_vid}/{shard_bid}"
        if not self._keys:
            raise TicketRefused(f"this blobnode has auth but no {what} key (auth.ticket_public_keys): it deletes "
                                "nothing")
        if intent is None:
            raise TicketRefused(f"a delete of {blob} takes the {what} access signed (carried by the delete message)")
        version, _, encoded = intent.signature.partition(".")
        if version != VERSION or len(intent.signature) > MAX_TEXT:
            raise TicketRefused(f"malformed {what} (want {VERSION}.<signature>)")
        signature = _signature(encoded, what)
        vid, bid, upload = intent.vid, intent.bid, intent.slices()
        if not _covers(vid, bid, upload, shard_vid, shard_bid):
            raise TicketRefused(f"the {what} for blob {vid}/{bid} does not cover {blob}")
        if not _verified(self._keys, signature, _intent_text(self.cluster_id, vid, bid, upload)):
            raise TicketRefused(f"the {what} for blob {vid}/{bid} is not access's for cluster {self.cluster_id}")
