"""`blobstore s3 user add|list|remove`: the S3 gateway's users and their keys, in its namespace store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from blobstore_server.cli.cli_common import DirOpt
from blobstore_server.cluster.launcher import DEFAULT_DIR, ClusterInfo
from blobstore_server.services.s3.namespace import NamespaceStore, open_namespace
from blobstore_server.services.s3.namespace.dialect import POSTGRES_SCHEMES

s3_app = typer.Typer(help="The S3 gateway: users and their access keys.", no_args_is_help=True,
                     pretty_exceptions_show_locals=False)
user_app = typer.Typer(help="Users: each holds one access key; buckets belong to the user who made them.",
                       no_args_is_help=True, pretty_exceptions_show_locals=False)
s3_app.add_typer(user_app, name="user")

NamespaceOpt = Annotated[str | None, typer.Option(
    "--namespace", envvar="BLOBSTORE_S3_NAMESPACE",
    help="The gateway's namespace, as its config's `namespace`: a SQLite file or a postgresql:// DSN; default: that "
         "of --dir's cluster.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _namespace(spec: str | None, root: Path) -> str:
    """The namespace named, or the one the gateways of the cluster in `root` share."""
    if spec is not None:
        return spec
    gateways = [p for p in ClusterInfo.load(root).processes if p.role == "s3"]
    if not gateways:
        raise ValueError(f"the cluster in {root} runs no S3 gateway: pass --namespace")
    return str(json.loads(Path(gateways[0].config).read_text())["namespace"])


@contextmanager
def _store(spec: str | None, root: Path) -> Iterator[NamespaceStore]:
    spec = _namespace(spec, root)
    if not spec.startswith(POSTGRES_SCHEMES) and not Path(spec).exists():  # a mistyped file would be a new one
        raise ValueError(f"no namespace at {spec}: pass --namespace (the gateway's `namespace`)")
    store = open_namespace(spec)
    try:
        yield store
    finally:
        store.close()


@user_app.command("add")
def add(name: str, namespace: NamespaceOpt = None, as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR) -> None:
    """Add user NAME and print its access key and secret (shown this once only)."""
    with _store(namespace, Path(dir)) as store:
        access_key, secret_key = store.add_user(name)
    if as_json:
        print(json.dumps({"name": name, "access_key": access_key, "secret_key": secret_key}))
    else:
        print(f"user {name}\naccess key {access_key}\nsecret key {secret_key}  (shown once: keep it now)")


@user_app.command("list")
def list_users(namespace: NamespaceOpt = None, as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR) -> None:
    """Every user and its access key (never a secret)."""
    with _store(namespace, Path(dir)) as store:
        users = store.list_users()
    if as_json:
        print(json.dumps([{"name": u.name, "access_key": u.access_key, "created_ms": u.created_ms} for u in users]))
    else:
        for user in users:
            print(f"{user.name}\t{user.access_key}")


@user_app.command("remove")
def remove(name: str, namespace: NamespaceOpt = None, dir: DirOpt = DEFAULT_DIR) -> None:
    """Remove user NAME: its key stops working within seconds; its buckets stay."""
    with _store(namespace, Path(dir)) as store:
        store.remove_user(name)
    print(f"removed {name}")
