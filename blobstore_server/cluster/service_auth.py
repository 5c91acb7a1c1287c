"""A service config's `auth` section for one role, derived from the cluster secret: what `cluster up` gives each
process (blobstore.plan), for a config written by hand (`blobstore auth config`, `make run`) or by a test."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from blobstore_server.cluster.plan import NAMED, role_keys
from blobstore_server.libs.mq.seal import message_key
from blobstore_server.libs.rpc.auth import new_secret

MESSAGE_ROLES = ("mqproxy", "tinker")


def role_auth(secret: str, role: str, config: dict[str, Any]) -> dict[str, Any]:
    """The `auth` section of a `role` process with `config`: the role's capabilities, a blobnode's or an
    allocator's identity named after its advertised host (its `host`, else http(s)://<bind_addr>, as clustermgr knows
    it), for clustermgr the identities root, for a ticket minter its private key (a blobnode: the public keys)."""
    name = None
    if role in NAMED:
        name = str(config.get("host") or f"{'https' if config.get('tls') else 'http'}://{config['bind_addr']}")
    return role_keys(secret, role, name).model_dump(mode="json", exclude_none=True)


def with_auth(secret: str, role: str, config: dict[str, Any]) -> dict[str, Any]:
    """`config` with its role's `auth` section, and for mqproxy and tinker the key sealing their messages. An
    `insecure` flag stays only where a link is left open that the secret cannot close (Kafka without a login:
    the operator's to give); otherwise `auth` and `insecure` exclude each other."""
    rest = {k: v for k, v in config.items() if k != "auth"}
    if role in MESSAGE_ROLES:
        rest.setdefault("message_key", message_key(secret).hex())
    if role not in MESSAGE_ROLES or "kafka_auth" in rest:
        rest.pop("insecure", None)
    return {**rest, "auth": role_auth(secret, role, config)}


def secret_file(path: Path) -> str:
    """The secret in `path`, generated there first (owner-only) if the file is missing."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_secret())
    return path.read_text().strip()


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """Write a config only its owner may read: it holds keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")
    os.chmod(path, 0o600)
