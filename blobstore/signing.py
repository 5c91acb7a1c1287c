"""The cluster's request signature, as far as the SDK needs it: a request signed with a *grant*, a capability handed
on for a while without its key (`blobstore auth grant undelete` prints one), which is how an SDK user takes a
DELETE back.

The servers sign and verify with the same text, header and grant keys (blobstore_server/libs/rpc/auth.py, which
describes the scheme): they are defined here, once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

AUTH_HEADER = "x-blobstore-auth"
_GRANT_TOKEN = re.compile(r"([a-z-]+)\.(\d+)\.([0-9a-f]{64})")


def signed_text(method: str, target: str, path: str, query: str, digest: str, ts: str, capability: str, nonce: str,
                identity: str, session: str) -> bytes:
    """What a request's signature is the HMAC of: method, the host:port it is sent to, path, query as sent, the body's
    digest, its time, capability, nonce, the signer's identity ("" for none) and its clustermgr session header (its
    fencing epoch and seq; "" for none)."""
    return "\n".join(("v2", method.upper(), target.lower(), path, query, digest, ts, capability, nonce,
                      identity, session)).encode()


def auth_header(capability: str, ts: str, nonce: str, sig: str, expires: int | None = None, identity: str = "") -> str:
    """The `x-blobstore-auth` value; `expires` for a grant's signature, `identity` for an identity-bound one."""
    extra = ("" if expires is None else f" exp={expires}") + (f" id={identity}" if identity else "")
    return f"v2 cap={capability} ts={ts} n={nonce}{extra} sig={sig}"


def grant_text(expires: int) -> bytes:
    """What a grant's key is the HMAC of, under its capability's key."""
    return f"grant {expires}".encode()


@dataclass(frozen=True)
class Grant:
    """`capability` until `expires` (unix seconds), without its key: the grant's key is HMAC(capability key,
    "grant <expires>"), so its holder can neither move the deadline nor recover the capability's key. Picklable;
    its key is kept out of reprs."""

    capability: str
    expires: int
    key: str = field(repr=False)  # hex

    @classmethod
    def of(cls, capability: str, key: bytes, expires: int) -> Grant:
        """The grant of `capability`, whose key is `key`, until `expires`."""
        return cls(capability, expires, hmac.new(key, grant_text(expires), hashlib.sha256).hexdigest())

    def to_token(self) -> str:
        """The grant as one string to hand over (a secret until it expires)."""
        return f"{self.capability}.{self.expires}.{self.key}"

    @classmethod
    def from_token(cls, token: str) -> Grant:
        match = _GRANT_TOKEN.fullmatch(token.strip())
        if match is None:
            raise ValueError("not a grant (CAPABILITY.EXPIRES.KEY, as `blobstore auth grant` prints it)")
        return cls(match[1], int(match[2]), match[3])

    def header(self, method: str, url: str, body: bytes, now: float | None = None) -> str:
        """The `x-blobstore-auth` value of a request to `url` carrying `body`, signed once, for a minute."""
        parts = urlsplit(url)
        ts, nonce = str(int(time.time() if now is None else now)), secrets.token_hex(12)
        text = signed_text(method, parts.netloc, parts.path, parts.query, hashlib.sha256(body).hexdigest(), ts,
                           self.capability, nonce, "", "")
        return auth_header(self.capability, ts, nonce, hmac.new(bytes.fromhex(self.key), text, hashlib.sha256)
                           .hexdigest(), self.expires)
