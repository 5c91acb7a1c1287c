"""Signed internal requests: who may call which route, and proof that they did, recently.

One cluster secret (made by `cluster up`) yields one key per role, HMAC-SHA256(secret, role). A process
holds the keys of the roles it signs and verifies as (`AuthConfig.keys`), never the secret; only the
operator's CLI derives every key. A request carries `x-blobstore-auth: v1 role=R ts=T sig=S`, S being the
HMAC under R's key of the method, path, sorted query, a body digest (SHA-256, or `unsigned:<length>` for
shard bytes, whose length the blobnode checks) and T. The server takes a signature only within `window`
seconds of its clock (so a captured request cannot be replayed later) and only from a role at or above the
route's (read < data < control < admin): a missing, stale or wrong signature is 401, a good one from a role
below the route's 403. During a rotation the `previous` keys are accepted too.

A `Grant` hands a role on for a while without its key: HMAC(role key, "grant <expires>"). Its holder signs
with `exp=<expires>` added to the header; the server derives the same key from its role key, so nobody can
move the deadline or recover the role key from a grant. Spark executors of `inspect run --deep` get a read
grant and nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import BaseModel, Field

from libs.rpc.errors import Forbidden, Unauthorized

AUTH_HEADER = "x-blobstore-auth"
SECRET_ENV = "BLOBSTORE_SECRET"  # the cluster secret, for an operator's command pointed at a cluster by URL
Buffer = bytes | bytearray | memoryview
UNSIGNED = "unsigned:"  # the body digest of streamed shard bytes: only their length is signed


class Role(StrEnum):
    READ = "read"  # reading and listing shards, nothing else (the inspection's executors)
    DATA = "data"  # shard and chunk calls to blobnodes
    CONTROL = "control"  # one service asking another (clustermgr, allocator, mqproxy, scheduler, ...)
    ADMIN = "admin"  # an operator changing the cluster: config, disk status, Raft membership

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {role: rank for rank, role in enumerate(Role)}


# Routes that need more (or less) than `control`; every other route needs `control`. Health and metrics
# are open. The access node's public API is not here: its Location and upload tokens are the capability.
PUBLIC = frozenset({"/health", "/metrics"})
ADMIN_ROUTES = frozenset({"/config/set", "/disk/set", "/raft/member/add", "/raft/member/remove",
                          "/fault/drop_reply"})
READ_ROUTES = frozenset({"/shard/get", "/shard/stat", "/shard/list", "/chunk/list", "/chunk/stat"})
DATA_PREFIXES = ("/shard/", "/chunk/")
STREAMED = frozenset({"/shard/put"})  # bodies signed by length only
MAX_GRANT = 7 * 86400.0  # a grant may not reach further ahead than this


def required_role(path: str) -> Role | None:
    """The least role a route takes; None for an open route."""
    if path in PUBLIC:
        return None
    if path in ADMIN_ROUTES:
        return Role.ADMIN
    if path in READ_ROUTES:
        return Role.READ
    if path.startswith(DATA_PREFIXES):
        return Role.DATA
    return Role.CONTROL


def role_key(secret: str, role: Role) -> str:
    return hmac.new(bytes.fromhex(secret), f"blobstore role {role}".encode(), hashlib.sha256).hexdigest()


def new_secret() -> str:
    return secrets.token_hex(32)


def _grant_key(key: bytes, expires: int) -> bytes:
    return hmac.digest(key, f"grant {expires}".encode(), "sha256")


@dataclass(frozen=True)
class Grant:
    """`role` until `expires` (unix seconds), without the role's key; picklable, its key kept out of reprs."""

    role: Role
    expires: int
    key: str = field(repr=False)  # hex

    @classmethod
    def of(cls, role: Role, role_key: bytes, expires: int) -> Grant:
        return cls(role, expires, _grant_key(role_key, expires).hex())


class AuthConfig(BaseModel):
    """The role keys a process signs and verifies with (hex), those of the last rotation still accepted, and
    how old a signature may be."""

    keys: dict[Role, str] = Field(min_length=1)
    previous: dict[Role, str] = Field(default_factory=dict)
    window: float = Field(60.0, gt=0)

    @classmethod
    def for_roles(cls, secret: str, roles: Iterable[Role], previous_secret: str | None = None) -> AuthConfig:
        roles = list(roles)
        return cls(keys={r: role_key(secret, r) for r in roles},
                   previous={r: role_key(previous_secret, r) for r in roles} if previous_secret else {})


EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()


def body_digest(body: Buffer | None, streamed: bool = False) -> str:
    if streamed:
        return f"{UNSIGNED}{0 if body is None else memoryview(body).nbytes}"
    return EMPTY_DIGEST if not body else hashlib.sha256(body).hexdigest()


def canonical_query(pairs: Iterable[tuple[str, str]]) -> str:
    return urlencode(sorted(pairs))


def _mac(key: bytes, method: str, path: str, query: str, digest: str, ts: str, role: Role) -> str:
    text = "\n".join((method.upper(), path, query, digest, ts, role))
    return hmac.digest(key, text.encode(), "sha256").hex()  # one-shot: OpenSSL's fast path


class Signer:
    """Signs each request with the least role it holds that the route takes (or its highest, which the
    server then refuses with 403)."""

    def __init__(self, keys: Mapping[Role, str], clock: Callable[[], float] = time.time,
                 expires: int | None = None) -> None:
        self.keys = {role: bytes.fromhex(key) for role, key in keys.items()}
        self.clock = clock
        self.expires = expires  # signing with a grant's key
        held = sorted(self.keys, key=lambda r: r.rank)
        self._signing_role = {needed: next((r for r in held if r.rank >= needed.rank), held[-1]) for needed in Role}

    @classmethod
    def from_grant(cls, grant: Grant, clock: Callable[[], float] = time.time) -> Signer:
        return cls({grant.role: grant.key}, clock, grant.expires)

    def grant(self, role: Role, ttl: float) -> Grant:
        """`role` handed on for `ttl` seconds; KeyError if this signer does not hold it."""
        return Grant.of(role, self.keys[role], int(self.clock() + ttl))

    def role_for(self, path: str) -> Role:
        return self._signing_role[required_role(path) or Role.DATA]

    def header(self, method: str, url: str, params: Mapping[str, str] | None, body: Buffer | None) -> str:
        parts = urlsplit(url)
        pairs = [*parse_qsl(parts.query, keep_blank_values=True), *(params or {}).items()]
        role = self.role_for(parts.path)
        ts = str(int(self.clock()))
        digest = body_digest(body, streamed=parts.path in STREAMED)
        sig = _mac(self.keys[role], method, parts.path, canonical_query(pairs), digest, ts, role)
        grant = "" if self.expires is None else f" exp={self.expires}"
        return f"v1 role={role} ts={ts}{grant} sig={sig}"


class Verifier:
    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.time) -> None:
        self.keys: dict[Role, list[bytes]] = {r: [bytes.fromhex(k)] for r, k in config.keys.items()}
        for role, key in config.previous.items():
            self.keys.setdefault(role, []).append(bytes.fromhex(key))
        self.window = config.window
        self.clock = clock

    def check(self, method: str, path: str, query_string: str, header: str | None, body: bytes | None,
              content_length: int | None) -> Role | None:
        """The caller's role, or Unauthorized / Forbidden saying why not. `body` is None for a streamed
        route (only its declared length is signed)."""
        needed = required_role(path)
        if needed is None:
            return None
        if not header:
            raise Unauthorized(f"{method} {path} needs a signed request ({AUTH_HEADER})")
        fields = dict(part.partition("=")[::2] for part in header.split()[1:]) if header.startswith("v1 ") else {}
        now = self.clock()
        try:
            role, ts, sig = Role(fields["role"]), fields["ts"], fields["sig"]
            age = abs(now - int(ts))
            expires = int(fields["exp"]) if "exp" in fields else None
        except (KeyError, ValueError):
            raise Unauthorized(f"malformed {AUTH_HEADER} header") from None
        if age > self.window:
            raise Unauthorized(f"signature {age:.0f}s old, outside the {self.window:.0f}s window")
        if role not in self.keys:
            raise Unauthorized(f"this service takes no {role} signatures")
        keys = self.keys[role]
        if expires is not None:
            if expires < now:
                raise Unauthorized(f"the {role} grant expired {now - expires:.0f}s ago")
            if expires > now + MAX_GRANT:
                raise Unauthorized(f"a grant may reach {MAX_GRANT:.0f}s ahead, not {expires - now:.0f}s")
            keys = [_grant_key(key, expires) for key in keys]
        digest = f"{UNSIGNED}{content_length or 0}" if body is None else body_digest(body)
        query = canonical_query(parse_qsl(query_string, keep_blank_values=True))
        if not any(hmac.compare_digest(sig, _mac(key, method, path, query, digest, ts, role)) for key in keys):
            raise Unauthorized(f"bad signature for {method} {path}")
        if role.rank < needed.rank:
            raise Forbidden(f"{method} {path} takes a {needed} caller, not {role}")
        return role


def operator_signer(secret: str | None = None) -> Signer | None:
    """A signer holding every role's key, derived from `secret` (else $BLOBSTORE_SECRET); None without one."""
    secret = secret if secret is not None else os.environ.get(SECRET_ENV)
    return None if secret is None else Signer(AuthConfig.for_roles(secret.strip(), Role).keys)


_installed: Signer | None = None


def install(signer: Signer | None) -> None:
    """Sign every request this process makes through `libs.rpc.client` with `signer` (None: stop)."""
    global _installed
    _installed = signer


def installed() -> Signer | None:
    return _installed
