"""`blobstore auth config ROLE CONFIG`: a hand-written service config with its role's keys added, so a service
started outside `cluster up` (`make run`) is signed and checked rather than open."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from blobstore_server.admin.plan import CAPABILITIES
from blobstore_server.admin.service_auth import secret_file, with_auth, write_private_json

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
