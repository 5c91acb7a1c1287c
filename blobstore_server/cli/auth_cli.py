"""`blobstore auth config ROLE CONFIG`: a hand-written service config with its role's keys added, so a service
started outside `cluster up` (`make run`) is signed and checked rather than open. `blobstore auth grant
CAPABILITY`: a capability handed on for a while without its key (an SDK user's undelete)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from blobstore_server.cli.cli_common import DirOpt, operator_grant
from blobstore_server.cluster.launcher import DEFAULT_DIR
from blobstore_server.cluster.plan import CAPABILITIES
from blobstore_server.cluster.service_auth import secret_file, with_auth, write_private_json
from blobstore_server.libs.rpc.auth import MAX_GRANT, SECRET_ENV
from blobstore_server.libs.rpc.routes import Capability

auth_app = typer.Typer(help="Signing keys for hand-written service configs.", no_args_is_help=True,
                       pretty_exceptions_show_locals=False)


@auth_app.command("config")
def config(role: Annotated[str, typer.Argument(help=f"One of: {', '.join(CAPABILITIES)}.")],
           template: Annotated[Path, typer.Argument(help="The service's config without keys (JSON).")],
           secret: Annotated[Path, typer.Option("--secret-file", help="The cluster secret; generated if missing.")],
           out: Annotated[Path, typer.Option("-o", "--out", help="Where the config with keys goes (mode 0600).")],
           ) -> None:
    """Write TEMPLATE plus ROLE's `auth` section (derived from the secret file) to OUT."""
    if role not in CAPABILITIES:
        raise ValueError(f"no role {role!r}; one of: {', '.join(CAPABILITIES)}")
    write_private_json(out, with_auth(secret_file(secret), role, json.loads(template.read_text())))
    print(out)


@auth_app.command("grant")
def grant(capability: Annotated[Capability, typer.Argument(help="e.g. undelete")],
          ttl: Annotated[float, typer.Option(min=1, max=MAX_GRANT, help="Seconds it lasts (at most 7 days).")] = 86400,
          dir: DirOpt = DEFAULT_DIR) -> None:
    """Print a grant of CAPABILITY for TTL seconds, from the cluster secret: an SDK user passes it as
    `Client(..., grant=...)` to sign with CAPABILITY (undelete) until it expires, without ever holding its key."""
    token = operator_grant(dir, capability, ttl)
    if token is None:
        raise ValueError(f"no cluster secret: set ${SECRET_ENV} or point --dir at a cluster folder")
    print(token)
