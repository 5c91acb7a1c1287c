"""Signed internal requests: which capability each route takes, who holds it, and proof that they called it,
once and recently.

One cluster secret (made by `cluster up`) yields one key per capability, HMAC-SHA256(secret, capability). Each
route takes exactly one capability (declared with the route in its service's API module; a server checks against
its own service's `RouteTable`, a client signs for the table of the service it calls; a path declared nowhere
takes `admin`, so a new route is closed until it is declared) and each service holds only the keys of what it
calls (cluster/plan.py), never the secret; only the operator's CLI derives every key. A request carries
`x-blobstore-auth: v2 cap=C ts=T n=N [id=I] [exp=E] sig=S`, S being the HMAC under C's key of the method,
the target host:port (a service takes only requests whose Host names itself), path, sorted query, a body
digest (SHA-256, or `unsigned:<length>` for shard bytes, whose CRC is then signed in the query), T, C, the
nonce N, the identity I and the `SESSION_HEADER` (clustermgr's session: fencing epoch and seq; "" when absent).
The server takes a signature only from T - `window` to T + `skew` of its clock, never one dated before the
second it started (so what its previous run accepted cannot pass again), and only once: it remembers every
nonce it accepted until the signature is too old to pass anyway, so a captured request cannot be replayed;
each caller (capability, or identity for an identity-bound one) may fill at most `caller_nonces` (half) of it,
so one flooding it gets 503 while the others are served. A missing, stale, replayed or wrong signature is 401;
a good one for another capability than the route's is 403. During a rotation the `previous` keys are accepted.

Identity-bound capabilities (`disk-report`: a blobnode adding, heartbeating or failing its own disks; `lease`: an
allocator leasing volumes and bids under its own name) are signed with a key of the process's own, derived from
HMAC(secret, "identities") with its name and the capability (`identity_key`), so the server (which holds the
identities root) learns who called, the route checks the caller owns what it touches, and one identity-bound
capability's key never signs another's (a blobnode cannot lease volumes).

A `Grant` hands a capability on for a while without its key: HMAC(key, "grant <expires>"). Its holder signs
with `exp=<expires>` added to the header; the server derives the same key from its own, so nobody can move the
deadline or recover the key from a grant. Spark executors of `inspect run --deep` get a read-shard grant and
nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import math
import os
import secrets
import string
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote_plus, urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator

from blobstore.signing import AUTH_HEADER, Grant, auth_header, grant_text, signed_text
from blobstore_server.libs.mac import hmac_sha256
from blobstore_server.libs.rpc import tickets
from blobstore_server.libs.rpc.errors import Forbidden, Unauthorized, Unavailable
from blobstore_server.libs.rpc.routes import Capability, RouteTable

log = logging.getLogger(__name__)
SECRET_ENV = "BLOBSTORE_SECRET"  # the cluster secret, for an operator's command pointed at a cluster by URL
Buffer = bytes | bytearray | memoryview
UNSIGNED = "unsigned:"  # the body digest of streamed shard bytes: their length, and their CRC in the query
CALLER_SCOPE_KEY = "blobstore.caller"  # where `authenticated` leaves the verified identity for a route
SESSION_HEADER = "x-clustermgr-session"  # clustermgr's session (libs/proto/clustermgr.Session): signed too


IDENTITY_BOUND = frozenset({Capability.DISK_REPORT, Capability.LEASE})
OPERATOR = "operator"  # the identity of the operator's signer, which holds every key and may act for any name
PUBLIC = frozenset({"/health", "/metrics"})
CRC_PARAM = "crc"
MAX_GRANT = 7 * 86400.0  # a grant may not reach further ahead than this


def required_capability(routes: RouteTable, path: str, public: bool = False) -> Capability | None:
    """The capability a route of `routes` takes; None for an open route. Undeclared routes take `admin`, or
    nothing in a service whose API is `public` (access, where the Location is the capability)."""
    if path in PUBLIC:
        return None
    declared = routes.capabilities.get(path)
    return declared if declared is not None or public else Capability.ADMIN


def capability_key(secret: str, capability: Capability) -> str:
    return hmac.new(bytes.fromhex(secret), f"blobstore capability {capability}".encode(), hashlib.sha256).hexdigest()


def identities_root(secret: str) -> str:
    """The key from which every process's identity key derives (held by servers of identity-bound routes)."""
    return hmac.new(bytes.fromhex(secret), b"blobstore identities", hashlib.sha256).hexdigest()


def identity_key(root: str, name: str, capability: Capability = Capability.DISK_REPORT) -> str:
    """`name`'s key for the identity-bound `capability` (disk-report keeps the derivation it had alone)."""
    text = f"identity {name}" if capability is Capability.DISK_REPORT else f"identity {capability} {name}"
    return hmac.new(bytes.fromhex(root), text.encode(), hashlib.sha256).hexdigest()


def new_secret() -> str:
    return secrets.token_hex(32)


def _grant_key(key: bytes, expires: int) -> bytes:
    return hmac_sha256(key, grant_text(expires))


class Identity(BaseModel):
    """A process's own name (its advertised host) and the key proving it (hex) for each identity-bound capability
    it signs. A config of before `lease` names one `key`: its disk-report key."""

    name: str = Field(min_length=1, pattern=r"^\S+$")
    keys: dict[Capability, str] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _one_key(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "key" in raw and "keys" not in raw:
            return {**{k: v for k, v in raw.items() if k != "key"}, "keys": {Capability.DISK_REPORT: raw["key"]}}
        return raw

    @classmethod
    def of(cls, root: str, name: str, capabilities: Iterable[Capability]) -> Identity:
        return cls(name=name, keys={c: identity_key(root, name, c) for c in capabilities})


class AuthConfig(BaseModel):
    """The capability keys a process signs and verifies with (hex), those of the last rotation still accepted,
    its own identity, the identities root if it serves identity-bound routes, and how old (or how far ahead of
    its clock) a signature may be."""

    keys: dict[Capability, str] = Field(min_length=1)
    previous: dict[Capability, str] = Field(default_factory=dict)
    identity: Identity | None = None
    identities: list[str] = Field(default_factory=list)  # hex roots: the current one, then the previous one
    window: float = Field(60.0, gt=0)
    skew: float = Field(5.0, ge=0)  # seconds a signature's time may run ahead of this clock
    nonces: int = Field(1_000_000, ge=1)  # accepted signatures remembered at most (beyond: 503, never a replay)
    caller_nonces: int | None = Field(None, ge=1)  # of those, at most this many of one caller (beyond: 503 to it;
    # None: half of `nonces`). A caller: a capability, or the identity signing an identity-bound one
    # host:port names others reach this service by besides the address it listens on (a DNS name, a proxy)
    names: list[str] = Field(default_factory=list)
    # Tickets (libs/rpc/tickets.py): a minter's private key of its one kind (hex Ed25519 seed: clustermgr's release,
    # the scheduler's discard, tinker's delete tickets, access's delete intents); a blobnode's public keys of each
    # kind (hex: the current one, then a rotation's previous), which check them
    ticket_signing_key: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    ticket_public_keys: dict[tickets.Kind, list[str]] = Field(default_factory=dict)

    @field_validator("ticket_public_keys", mode="before")
    @classmethod
    def _release_keys(cls, raw: Any) -> Any:
        """A config of before discard and delete tickets lists its release keys only."""
        return {tickets.Kind.RELEASE: raw} if isinstance(raw, list) else raw

    def minter(self, kind: tickets.Kind) -> tickets.Minter | None:
        """The minter of `kind` tickets this process holds; None (and a warning: blobnodes will refuse every such
        call it decides) when its auth has no key of that kind."""
        if self.ticket_signing_key is None:
            log.warning("auth has no ticket_signing_key: blobnodes will refuse every %s this process decides", kind)
            return None
        return tickets.Minter(self.ticket_signing_key, kind)

    def intents(self, cluster_id: int) -> tickets.IntentSigner | None:
        """Access's signer of delete intents for cluster `cluster_id` (libs/rpc/tickets.py); None (and a warning)
        without its key."""
        if self.ticket_signing_key is None:
            log.warning("auth has no ticket_signing_key: blobnodes will refuse every delete this process asks")
            return None
        return tickets.IntentSigner(self.ticket_signing_key, cluster_id)

    @classmethod
    def for_capabilities(cls, secret: str, capabilities: Iterable[Capability], previous_secret: str | None = None,
                         *, name: str | None = None, verifies_identities: bool = False,
                         mints: tickets.Kind | None = None, verifies_tickets: bool = False) -> AuthConfig:
        """A process named `name` signs the identity-bound ones of `capabilities` (a blobnode's disk reports
        when it lists none) with keys of its own; it holds a shared key for each of the others. One that
        `mints` tickets of a kind holds that kind's private key only; one that `verifies_tickets` (a blobnode)
        the public keys of every kind only."""
        capabilities = list(capabilities)
        bound = [c for c in capabilities if c in IDENTITY_BOUND] or [Capability.DISK_REPORT]
        shared = [c for c in capabilities if c not in IDENTITY_BOUND]
        previous = {c: capability_key(previous_secret, c) for c in shared} if previous_secret else {}
        identity = None if name is None else Identity.of(identities_root(secret), name, bound)
        roots = [identities_root(s) for s in (secret, previous_secret) if s] if verifies_identities else []
        minting = None if mints is None else tickets.signing_key(secret, mints)
        checking = {kind: [tickets.public_key(tickets.signing_key(s, kind)) for s in (secret, previous_secret) if s]
                    for kind in tickets.KEYED} if verifies_tickets else {}
        return cls(keys={c: capability_key(secret, c) for c in shared}, previous=previous, identity=identity,
                   identities=roots, ticket_signing_key=minting, ticket_public_keys=checking)


EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()


def body_digest(body: Buffer | None, streamed: bool = False) -> str:
    if streamed:
        return f"{UNSIGNED}{0 if body is None else memoryview(body).nbytes}"
    return EMPTY_DIGEST if not body else hashlib.sha256(body).hexdigest()


def address(sockname: Any) -> str:
    """host:port of a socket address, as a Host header writes it ("" when unknown)."""
    if not sockname or len(sockname) < 2 or sockname[1] is None:
        return ""
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_target(target: str, names: frozenset[str], local: str) -> None:
    """A request signed for one service is refused by every other: its Host must be the address it arrived at
    (`local`) or one of `names` (host:port others reach this service by)."""
    if target not in names and target != local:
        raise Unauthorized(f"this request was signed for {target or 'no host'}, not for this service")


def query_pairs(query: str) -> list[tuple[str, str]]:
    """`parse_qsl(query, keep_blank_values=True)`, without its per-piece unquoting when nothing is escaped (the
    shard routes' queries are names and digits)."""
    if "%" in query or "+" in query:
        return parse_qsl(query, keep_blank_values=True)
    return [(name, value) for name, _, value in (piece.partition("=") for piece in query.split("&") if piece)]


_UNQUOTED = frozenset(string.ascii_letters + string.digits + "_.-~")  # what `quote_plus` leaves as it is


def encode_query(params: Mapping[str, str]) -> str:
    """`urlencode(params)`, without quoting names and values that need none (the data path's are names, digits and
    dots; urllib's quoting was ~5% of an access node's CPU per small PUT)."""
    return "&".join(f"{_quoted(name)}={_quoted(value)}" for name, value in params.items())


def _quoted(text: str) -> str:
    return text if _UNQUOTED.issuperset(text) else quote_plus(text)


def query_as_sent(url: str, params: Mapping[str, str] | None) -> str:
    """The query string a request to `url` with `params` carries: the URL's own, then `params` urlencoded, which
    is what every transport here sends (`libs.rpc.client` folds params into the URL before signing). The
    signature covers it byte for byte, so a verifier checks the query it received without parsing it."""
    query = urlsplit(url).query
    if not params:
        return query
    return f"{query}&{encode_query(params)}" if query else encode_query(params)


def sign(key: bytes, method: str, target: str, path: str, query: str, digest: str, ts: str, capability: Capability,
         nonce: str, identity: str, session: str = "") -> str:
    """The signature of a request to `target` (the host:port it is sent to, as its Host header says) carrying
    `session` in its `SESSION_HEADER` ("": none)."""
    return hmac_sha256(key, signed_text(method, target, path, query, digest, ts, capability, nonce, identity,
                                        session)).hex()


class _Nonces:
    """Nonces unique per process without a system call each: a random prefix, renewed in a forked child (Spark's
    Python workers fork), and a counter. `os.urandom` gives up the GIL, and a process whose other threads are
    busy (access's codec threads) waited up to the 5 ms switch interval to take it back: 1.8 ms per request."""

    def __init__(self) -> None:
        self._renew()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):08x}"


_nonces = _Nonces()


class Signer:
    """Signs each request with the capability its route takes; a process that does not hold it gets Forbidden
    before anything is sent."""

    def __init__(self, keys: Mapping[Capability, str], clock: Callable[[], float] = time.time,
                 expires: int | None = None, identity: Identity | None = None) -> None:
        self.keys = {capability: bytes.fromhex(key) for capability, key in keys.items()}
        self.clock = clock
        self.expires = expires  # signing with a grant's key
        self.identity = identity

    @classmethod
    def from_config(cls, config: AuthConfig) -> Signer:
        return cls(config.keys, identity=config.identity)

    @classmethod
    def from_grant(cls, grant: Grant, clock: Callable[[], float] = time.time) -> Signer:
        return cls({Capability(grant.capability): grant.key}, clock, grant.expires)

    def grant(self, capability: Capability, ttl: float) -> Grant:
        """`capability` handed on for `ttl` seconds; KeyError if this signer does not hold it."""
        return Grant.of(capability, self.keys[capability], int(self.clock() + ttl))

    def header(self, method: str, url: str, params: Mapping[str, str] | None, body: Buffer | None,
               routes: RouteTable, session: str = "") -> str:
        """The header of a request to `url`, one of `routes` (those of the service it goes to), whose
        `SESSION_HEADER` is `session` ("": none)."""
        parts = urlsplit(url)
        capability = required_capability(routes, parts.path)
        if capability is None:
            return "v2 public"  # an open route: nothing to prove
        ts, nonce = str(int(self.clock())), _nonces.next()
        digest = body_digest(body, streamed=parts.path in routes.streamed)
        name = ""
        if capability in IDENTITY_BOUND:
            own = None if self.identity is None else self.identity.keys.get(capability)
            if self.identity is None or own is None:
                raise Forbidden(f"{method} {parts.path} is signed by a process's own {capability} identity; this "
                                f"one has none")
            key, name = bytes.fromhex(own), self.identity.name
        elif capability in self.keys:
            key = self.keys[capability]
        else:
            raise Forbidden(f"{method} {parts.path} takes the {capability} capability, which this process lacks")
        query = query_as_sent(url, params) if params else parts.query
        sig = sign(key, method, parts.netloc, parts.path, query, digest, ts, capability, nonce, name, session)
        return auth_header(capability, ts, nonce, sig, self.expires, name)


class NonceCache:
    """Nonces of accepted signatures, each under its caller, in sets by the second they stop mattering (their
    signature's time plus the window: a replay carries its signed time, so it meets its original's set); a set is
    dropped whole once past. Bounded in all (`limit`) and per caller (`per_caller`), so one caller filling its
    share is refused (503) while the others are still served. Sets by second rather than an entry per nonce in one
    ordered map: 1.0-1.7 us per add against 2.0-2.2 at 4,000 adds a second, and no timestamp object per nonce."""

    def __init__(self, limit: int, per_caller: int | None = None) -> None:
        self.limit = limit
        self.per_caller = limit if per_caller is None else per_caller
        self._sets: dict[int, set[str]] = {}  # second (rounded up) -> "caller nonce" that matter until then
        self._counts: dict[int, Counter[str]] = {}  # second -> how many of its set each caller has
        self._held: Counter[str] = Counter()  # caller -> nonces remembered
        self._size = 0
        self._swept = -math.inf

    def add(self, nonce: str, until: float, now: float, caller: str = "") -> None:
        """Remember `caller`'s `nonce` until `until`; Unauthorized if it was seen, Unavailable if the cache or the
        caller's share of it is full."""
        if now >= self._swept + 1:  # at most once a second
            for second in [s for s in self._sets if s < now]:
                self._size -= len(self._sets.pop(second))
                self._held -= self._counts.pop(second)
            self._swept = now
        second = math.ceil(until)
        nonces = self._sets.setdefault(second, set())
        key = f"{caller} {nonce}"
        if key in nonces:
            raise Unauthorized("this signature was used before (a replayed request)")
        if self._size >= self.limit:
            raise Unavailable("too many signed requests within the signature window; retry shortly")
        if self._held[caller] >= self.per_caller:
            raise Unavailable(f"too many signed requests of {caller} within the signature window; retry shortly")
        nonces.add(key)
        counts = self._counts.get(second)
        if counts is None:
            counts = self._counts[second] = Counter()
        counts[caller] += 1
        self._held[caller] += 1
        self._size += 1


@dataclass(frozen=True)
class Caller:
    """Who a verified request came from: the capability it used and, for an identity-bound one, whose."""

    capability: Capability
    identity: str | None = None


class Verifier:
    """Checks requests to the `routes` a service serves."""

    def __init__(self, config: AuthConfig, routes: RouteTable, clock: Callable[[], float] = time.time) -> None:
        self.routes = routes
        self.keys: dict[Capability, list[bytes]] = {c: [bytes.fromhex(k)] for c, k in config.keys.items()}
        for capability, key in config.previous.items():
            self.keys.setdefault(capability, []).append(bytes.fromhex(key))
        self.identities = config.identities
        self.window, self.skew = config.window, config.skew
        self.nonces = NonceCache(config.nonces, config.caller_nonces or max(1, config.nonces // 2))
        self.clock = clock
        # Its previous run remembered the nonces it took, this one does not: it takes no signature dated before
        # the second it started (a restart takes longer than that second, so nothing that run took qualifies)
        self.started = int(clock())

    def check(self, method: str, path: str, query_string: str, header: str | None, body: bytes | None,
              content_length: int | None, target: str = "", session: str = "") -> Caller | None:
        """Who called, or Unauthorized / Forbidden saying why not. `body` is None for a streamed route (its
        declared length and the CRC in its query are signed); `target` is the request's Host, which the caller
        checks names this service; `session` its `SESSION_HEADER` ("": none)."""
        needed = required_capability(self.routes, path)
        if needed is None:
            return None
        if not header:
            raise Unauthorized(f"{method} {path} needs a signed request ({AUTH_HEADER})")
        fields = dict(part.partition("=")[::2] for part in header.split()[1:]) if header.startswith("v2 ") else {}
        now = self.clock()
        try:
            capability, ts, nonce, sig = Capability(fields["cap"]), fields["ts"], fields["n"], fields["sig"]
            signed_at = int(ts)
            expires = int(fields["exp"]) if "exp" in fields else None
        except (KeyError, ValueError):
            raise Unauthorized(f"malformed {AUTH_HEADER} header") from None
        if signed_at < now - self.window:
            raise Unauthorized(f"signature {now - signed_at:.0f}s old, outside the {self.window:.0f}s window")
        if signed_at > now + self.skew:
            raise Unauthorized(f"signature dated {signed_at - now:.0f}s ahead of this clock (at most "
                               f"{self.skew:.0f}s)")
        if signed_at < self.started:
            raise Unauthorized(f"signature dated {self.started - signed_at}s before this service started: sign it "
                               f"anew")
        name = fields.get("id", "")
        keys = self._keys(capability, name)
        if expires is not None:
            if expires < now:
                raise Unauthorized(f"the {capability} grant expired {now - expires:.0f}s ago")
            if expires > now + MAX_GRANT:
                raise Unauthorized(f"a grant may reach {MAX_GRANT:.0f}s ahead, not {expires - now:.0f}s")
            keys = [_grant_key(key, expires) for key in keys]
        if body is None and path in self.routes.streamed and f"&{CRC_PARAM}=" not in f"&{query_string}":
            raise Unauthorized(f"{method} {path} must sign the shard's CRC ({CRC_PARAM}=) in its query")
        digest = f"{UNSIGNED}{content_length or 0}" if body is None else body_digest(body)
        if not any(hmac.compare_digest(sig, sign(key, method, target, path, query_string, digest, ts, capability,
                                                 nonce, name, session)) for key in keys):
            raise Unauthorized(f"bad signature for {method} {path}")
        if capability is not needed:
            raise Forbidden(f"{method} {path} takes the {needed} capability, not {capability}")
        self.nonces.add(nonce, signed_at + self.window + 1, now, f"{capability} {name}" if name else capability)
        return Caller(capability, name or None)

    def _keys(self, capability: Capability, name: str) -> list[bytes]:
        if capability in IDENTITY_BOUND:
            if not name:
                raise Unauthorized(f"a {capability} signature must name its signer (id=)")
            if not self.identities:
                raise Unauthorized(f"this service takes no {capability} signatures")
            return [bytes.fromhex(identity_key(root, name, capability)) for root in self.identities]
        if capability not in self.keys:
            raise Unauthorized(f"this service takes no {capability} signatures")
        return self.keys[capability]


def operator_signer(secret: str | None = None) -> Signer | None:
    """A signer holding every capability's key and the identity "operator" (which owns no disk), derived from
    `secret` (else $BLOBSTORE_SECRET); None without one."""
    secret = secret if secret is not None else os.environ.get(SECRET_ENV)
    return None if secret is None else Signer.from_config(
        AuthConfig.for_capabilities(secret.strip(), Capability, name=OPERATOR))


_installed: Signer | None = None


def install(signer: Signer | None) -> None:
    """Sign every request this process makes through `libs.rpc.client` with `signer` (None: stop)."""
    global _installed
    _installed = signer


def installed() -> Signer | None:
    return _installed
