"""The launcher's Redis: one ACL user whose password derives from the cluster secret. No I/O here.

Derived rather than generated so `deploy render` gives every host's bundle the same password without storing
one more secret, as the role keys are. redis.conf holds only the password's SHA-256 (Redis ACL `#<hash>`), so
the Redis host's files do not give it away; the access nodes, its only clients, get it in their `redis_url`.
The default user is off: a client without the password can run no command at all.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote, urlsplit, urlunsplit

REDIS_USER = "blobstore"


def redis_password(secret: str) -> str:
    return hmac.digest(bytes.fromhex(secret), b"blobstore redis password", hashlib.sha256).hex()


def acl_config(secret: str) -> str:
    """redis.conf lines: the default user off, ours on with every key and command (it is the cache's owner)."""
    hashed = hashlib.sha256(redis_password(secret).encode()).hexdigest()
    return f"user default off\nuser {REDIS_USER} on #{hashed} ~* &* +@all\n"


def with_credentials(url: str, secret: str) -> str:
    """`redis://host:port/db` as a client of ours connects: `redis://blobstore:<password>@host:port/db`."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(REDIS_USER)}:{quote(redis_password(secret))}@{host}"))


def redacted(url: str) -> str:
    """`url` with any password replaced by `***`, for logs and status output."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}"))
