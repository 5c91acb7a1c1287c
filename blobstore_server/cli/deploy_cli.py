"""`blobstore deploy`: check a cluster spec and render it into one bundle per host (docs/operations.md: "Deploy on
your machines")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from blobstore_server.cluster import pki, render
from blobstore_server.cluster.plan import hosts_of, plan_spec
from blobstore_server.cluster.spec import ClusterSpec, load
from blobstore_server.libs.rpc.auth import new_secret

deploy_app = typer.Typer(help="Deploy on your machines: check a cluster spec, render per-host bundles.",
                         no_args_is_help=True, pretty_exceptions_show_locals=False)
SpecArg = Annotated[Path, typer.Argument(help="The cluster spec (TOML), e.g. deploy/cluster.example.toml.")]


def _summary(spec: ClusterSpec) -> str:
    roles = ", ".join(f"{len(spec.hosts_of(r))} {r}" for r in ("clustermgr", "blobnode", "access", "kafka")
                      if spec.hosts_of(r))
    racks = len({h.rack for h in spec.hosts})
    modes = ", ".join(m.name for m in spec.code_modes)
    return f"{len(spec.hosts)} hosts in {racks} rack(s): {roles}; code modes {modes}"


def cluster_secret(spec: ClusterSpec, out: Path) -> tuple[str, Path]:
    """The secret at `secret_file`, else the one a previous render left in `out`, else a new one written there
    (mode 0600); and where it was found."""
    for path in (Path(spec.secret_file), out / "cluster.secret"):
        if path.exists():
            return path.read_text().strip(), path
    secret = new_secret()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cluster.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    return secret, path


@deploy_app.command("check")
def check(spec_file: SpecArg) -> None:
    """Validate the spec only; a problem is one error line naming it."""
    typer.echo(f"{spec_file}: ok, {_summary(load(spec_file))}")


@deploy_app.command("render")
def render_bundles(spec_file: SpecArg,
                   out: Annotated[Path, typer.Option("--out", help="Folder for the bundles, one per host.")]) -> None:
    """Write OUT/<host>/ for every host: configs (0600), systemd units and a README of the steps."""
    spec = load(spec_file)
    secret, where = cluster_secret(spec, out)
    plan = plan_spec(spec, spec.python, secret)
    files = render.bundle(spec, plan)
    render.write(out, files)
    for host in hosts_of(plan.processes) or [h.name for h in spec.hosts]:
        mine = [f for f in files if f.path.parts[0] == host]
        typer.echo(f"{out / host}/: {len(mine)} files (README.md says what to copy where)")
    typer.echo(f"keys derive from the cluster secret in {where}: keep it on the operator's machine "
               f"({spec.secret_file}), never on the hosts")
    if plan.tls:
        typer.echo(f"TLS on: clients trust the cluster CA in {out / pki.CA_FILE} (the CLI's --ca, "
                   f"BLOBSTORE_CA, the SDK's Client(ca=...), curl --cacert)")
