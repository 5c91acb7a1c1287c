"""`blobstore s3 user add|list|remove`: the S3 gateway's users and their keys, in its namespace store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from blobstore_server.services.s3.namespace import NamespaceStore, open_sqlite

s3_app = typer.Typer(help="The S3 gateway: users and their access keys.", no_args_is_help=True,
                     pretty_exceptions_show_locals=False)
user_app = typer.Typer(help="Users: each holds one access key; buckets belong to the user who made them.",
                       no_args_is_help=True, pretty_exceptions_show_locals=False)
s3_app.add_typer(user_app, name="user")

NamespaceOpt = Annotated[Path, typer.Option("--namespace", envvar="BLOBSTORE_S3_NAMESPACE",
                                            help="The gateway's namespace (its config's `namespace` file).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
DEFAULT_NAMESPACE = Path("run/s3/namespace.db")


@contextmanager
def _store(path: Path) -> Iterator[NamespaceStore]:
    if not path.exists():
        raise ValueError(f"no namespace at {path}: pass --namespace (the gateway's `namespace` file)")
    store = open_sqlite(path)
    try:
        yield store
    finally:
        store.close()


@user_app.command("add")
def add(name: str, namespace: NamespaceOpt = DEFAULT_NAMESPACE, as_json: JsonOpt = False) -> None:
    """Add user NAME and print its access key and secret (shown this once only)."""
    with _store(namespace) as store:
        access_key, secret_key = store.add_user(name)
    if as_json:
        print(json.dumps({"name": name, "access_key": access_key, "secret_key": secret_key}))
    else:
        print(f"user {name}\naccess key {access_key}\nsecret key {secret_key}  (shown once: keep it now)")


@user_app.command("list")
def list_users(namespace: NamespaceOpt = DEFAULT_NAMESPACE, as_json: JsonOpt = False) -> None:
    """Every user and its access key (never a secret)."""
    with _store(namespace) as store:
        users = store.list_users()
    if as_json:
        print(json.dumps([{"name": u.name, "access_key": u.access_key, "created_ms": u.created_ms} for u in users]))
    else:
        for user in users:
            print(f"{user.name}\t{user.access_key}")


@user_app.command("remove")
def remove(name: str, namespace: NamespaceOpt = DEFAULT_NAMESPACE) -> None:
    """Remove user NAME: its key stops working within seconds; its buckets stay."""
    with _store(namespace) as store:
        store.remove_user(name)
    print(f"removed {name}")
