"""What the `blobstore` command's modules share: the consoles, the common options, where a cluster's services
answer, table-or-JSON output, and the subcommand groups several modules add commands to."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import httpx
import typer
from confluent_kafka import KafkaException
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from blobstore import Client
from blobstore.errors import BlobstoreError
from blobstore.signing import Grant
from blobstore_server.cluster.kafka_auth import kafka_user
from blobstore_server.cluster.launcher import (
    SECRET_FILE,
    ClusterInfo,
    LauncherError,
    cluster_ca,
    cluster_secret,
    sign_as_operator,
    trust_cluster,
)
from blobstore_server.libs.mq.settings import KafkaAuth
from blobstore_server.libs.rpc.auth import SECRET_ENV, capability_key
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.libs.rpc.tickets import IntentSigner, Kind, signing_key
from blobstore_server.services.clustermgr.client import ClusterClient

T = TypeVar("T")
EXPECTED = (BlobstoreError, RpcError, LauncherError, OSError, ValueError, httpx.HTTPError, KafkaException)
out = Console()
err = Console(stderr=True)


class CommandGroup(TyperGroup):
    """Turns an expected failure anywhere below into one line and exit status 1."""

    def invoke(self, ctx: Any) -> Any:  # typer vendors click: its Context type is private
        try:
            return super().invoke(ctx)
        except EXPECTED as exc:
            err.print(f"error: {exc}", style="red", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None


def sub_app(help_text: str) -> typer.Typer:
    return typer.Typer(help=help_text, no_args_is_help=True, pretty_exceptions_show_locals=False)


# subcommand groups that more than one module adds commands to
disk_app: typer.Typer = sub_app("Disks: status, drop, repair progress.")
volume_app: typer.Typer = sub_app("Volumes, and moving their units.")


DirOpt = Annotated[Path, typer.Option("--dir", help="Folder of the local cluster (its cluster.json).")]
AccessOpt = Annotated[str, typer.Option("--access", help="Access URL(s), comma-separated [default: cluster.json].")]
CmOpt = Annotated[str, typer.Option("--clustermgr", help="clustermgr URL(s), comma-separated [default: cluster.json].")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def access_urls(root: Path, access: str) -> list[str]:
    """The access URLs given, or every access node of the local cluster."""
    return access.split(",") if access else ClusterInfo.load(root).access_urls


def sdk(root: Path, access: str, grant: str | None = None) -> Client:
    """An SDK client of `access_urls`, trusting the cluster's CA ($BLOBSTORE_CA or the folder's ca.pem)."""
    return Client(access_urls(root, access), grant=grant, ca=trust_cluster(root if root.exists() else None))


def clustermgr_urls(root: Path, clustermgr: str) -> list[str]:
    """The clustermgr URLs given, or the local cluster's; requests are signed with the secret of $BLOBSTORE_SECRET
    or the cluster folder (never one given on the command line, where other users could read it)."""
    if clustermgr:
        sign_as_operator(root if root.exists() else None)
        trust_cluster(root if root.exists() else None)
        return clustermgr.split(",")
    return ClusterInfo.load(root).clustermgr_urls


def kafka_bootstrap(root: Path, kafka: str) -> str:
    bootstrap = kafka or ClusterInfo.load(root).kafka_bootstrap
    if not bootstrap:
        raise ValueError(f"the cluster in {root}/ runs no Kafka: pass --kafka HOST:PORT")
    return bootstrap


KafkaUserOpt = Annotated[str, typer.Option(
    "--kafka-user", help="Log in to Kafka as this user (backlog, admin), its password derived from the secret "
    "[default: backlog for the cluster.json's Kafka, none for --kafka].")]


def kafka_login(root: Path, kafka: str, user: str) -> KafkaAuth | None:
    """The SASL login for the Kafka of `kafka_bootstrap`: the read-only backlog user on the cluster folder's own broker
    (which requires one, over TLS trusting the folder's CA when it has one), `user` if named; the password derives
    from $BLOBSTORE_SECRET or the folder's secret."""
    user = user or ("" if kafka else "backlog")
    if not user:
        return None
    secret = cluster_secret(root)
    if not secret:
        if kafka:
            raise ValueError(f"--kafka-user {user} needs the cluster secret: ${SECRET_ENV} or {root}/{SECRET_FILE}")
        return None  # a cluster folder without a secret was started before Kafka had users
    return kafka_user(secret, user, None if kafka else cluster_ca(root))


def operator_grant(root: Path, capability: Capability, ttl: float) -> str | None:
    """A grant of `capability` for `ttl` seconds, as the SDK takes it (`Client(grant=)`), from $BLOBSTORE_SECRET or
    the cluster folder's secret; None without one (a cluster run without auth takes unsigned requests)."""
    secret = cluster_secret(root)
    if not secret:
        return None
    key = bytes.fromhex(capability_key(secret, capability))
    return Grant.of(capability, key, int(time.time() + ttl)).to_token()


def operator_intents(root: Path, cluster_id: int) -> IntentSigner | None:
    """The signer of the delete intents the operator's delete messages to cluster `cluster_id` carry (an inspection's
    partial deletes), from $BLOBSTORE_SECRET or the cluster folder's secret; None without one (blobnodes with auth
    then delete none)."""
    secret = cluster_secret(root)
    return IntentSigner(signing_key(secret, Kind.INTENT), cluster_id) if secret else None


def tinker_url(root: Path, tinker: str) -> str:
    urls = [tinker] if tinker else [p.url for p in ClusterInfo.load(root).processes if p.role == "tinker"]
    if not urls:
        raise ValueError(f"the cluster in {root}/ runs no tinker: pass --tinker URL")
    return urls[0]


def on_cluster(root: Path, clustermgr: str, call: Callable[[ClusterClient], Awaitable[T]]) -> T:
    async def run() -> T:
        async with ClusterClient(clustermgr_urls(root, clustermgr)) as cm:
            return await call(cm)

    return asyncio.run(run())


def emit(rows: Sequence[Mapping[str, object]], as_json: bool, title: str | None = None) -> None:
    """Rows as a table, or as JSON for scripts."""
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=title)
    for column in rows[0] if rows else []:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    out.print(table)
