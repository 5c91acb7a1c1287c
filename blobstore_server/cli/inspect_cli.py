"""`blobstore inspect run|backlog`: the Spark jobs.

Imported by cli/cli.py once its shared options and helpers exist; the jobs' modules (pyspark) load only
when a job runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from blobstore_server.cli.cli_common import (
    CmOpt,
    DirOpt,
    JsonOpt,
    KafkaUserOpt,
    clustermgr_urls,
    emit,
    err,
    kafka_bootstrap,
    kafka_login,
    on_cluster,
    operator_intents,
    out,
)
from blobstore_server.cluster.launcher import DEFAULT_DIR, ClusterInfo, LauncherError, cluster_ca, cluster_secret
from blobstore_server.cluster.plan import EXPORT_ROOT, export_access
from blobstore_server.libs.proto.blobnode import S3Access
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.errors import Forbidden, Unauthorized
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.mqproxy.client import MqProxyClient

inspect_app = typer.Typer(help="Offline checks on Spark: volume inspection and the repair backlog.",
                          no_args_is_help=True, pretty_exceptions_show_locals=False)

UNRECOVERABLE_EXIT = 2
REFUSED_EXIT = 3  # a request of the job (export, shard reads, queued repairs, task records) was refused
OutOpt = Annotated[str, typer.Option("--out", help="Output folder or URI [default: run: the gateway's bucket "
                                                   "s3://blobstore-inspect/inspect, else DIR/inspect; backlog: "
                                                   "DIR/backlog].")]
MasterOpt = Annotated[str, typer.Option("--master", help="Spark master: local[*], spark://HOST:PORT, ...")]
ConfOpt = Annotated[list[str] | None, typer.Option("--conf", help="Spark setting KEY=VALUE (repeatable).")]
S3Opt = Annotated[str, typer.Option("--s3", help="The S3 gateway of the cluster's inspection bucket "
                                                 "[default: the cluster folder's first].")]


def _conf(pairs: list[str] | None) -> dict[str, str]:
    conf = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--conf")
        conf[key] = value
    return conf


def _refused(why: str) -> NoReturn:
    err.print(f"refused: {why}; nothing was concluded (the cluster's secret, the services' keys or --grant-ttl?)",
              style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(REFUSED_EXIT)


@contextmanager
def _refusals_fail() -> Iterator[None]:
    """A refused request anywhere in a job (here or in its executors) ends it with REFUSED_EXIT and the reason:
    a refused read must never look like a shard that is fine."""
    from blobstore_server.spark.deep import refusal

    try:
        yield
    except (Unauthorized, Forbidden) as exc:
        _refused(f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        why = refusal(exc)
        if why is None:
            raise
        _refused(why)


def _absolute(path_or_uri: str) -> str:
    return path_or_uri if "://" in path_or_uri else str(Path(path_or_uri).resolve())


def _export_access(root: Path, gateway: str) -> S3Access | None:
    """The user of the inspection's bucket on `gateway` (or the cluster folder's first), its keys derived from the
    cluster secret as the blobnodes' are, its certificate checked against the cluster's CA; None without a gateway
    or a secret."""
    secret = cluster_secret(root)
    if not gateway:
        try:
            gateway = next((p.url for p in ClusterInfo.load(root).processes if p.role == "s3"), "")
        except LauncherError:
            gateway = ""
    if not (secret and gateway):
        return None
    return export_access(secret, gateway).model_copy(update={"ca_file": cluster_ca(root)})  # an https one's CA


def _pem(ca_file: str | None) -> str | None:
    """The CA certificate's text, which travels to executors on other machines where the file's path would not."""
    return Path(ca_file).read_text() if ca_file else None


def _tinker_config(root: Path) -> dict[str, Any]:
    """The local cluster's tinker config (its cluster id and group prefix), if there is one."""
    try:
        info = ClusterInfo.load(root)
    except LauncherError:
        return {}
    configs = [json.loads(Path(p.config).read_text()) for p in info.processes if p.role == "tinker"]
    return configs[0] if configs else {}


# inspect


@inspect_app.command("run")
def inspect_run(out_: OutOpt = "", master: MasterOpt = "local[*]",
                deep: Annotated[bool, typer.Option(help="Also read every shard: CRCs and stripe parity.")] = False,
                repair: Annotated[bool, typer.Option(
                    help="Queue repairs (and deletes of partial deletes) through mqproxy [default: dry run].")] = False,
                settle: Annotated[float, typer.Option(
                    help="Seconds before the export in which writes count as in flight (skipped).")] = 600.0,
                delete_delay: Annotated[float, typer.Option(
                    help="tinker's safe delay: mark-deleted longer than this is 'not purged'.")] = 4 * 3600.0,
                repair_rate: Annotated[float, typer.Option(help="Messages per second with --repair.")] = 100.0,
                deep_rate: Annotated[float, typer.Option(help="MB/s of shard reads per Spark task (--deep).")] = 32.0,
                input_: Annotated[str, typer.Option(
                    "--input", help="Inspect an existing export instead of exporting anew.")] = "",
                export_timeout: Annotated[float, typer.Option(help="Seconds a blobnode may take to export.")] = 600.0,
                grant_ttl: Annotated[float, typer.Option(
                    help="Seconds the executors' read grant (--deep) lasts.")] = 86400.0,
                cluster_id: Annotated[int | None, typer.Option(
                    help="The cluster whose deletes --repair signs [default: tinker's config in DIR, else 1].")] = None,
                conf: ConfOpt = None, dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "", s3: S3Opt = "") -> None:
    """Export every disk's shard index and clustermgr's tables, then classify every blob on Spark: missing
    shards, unrecoverable, size mismatch, partial delete, not purged, orphan units. Exports and findings go to the
    bucket s3://blobstore-inspect/inspect of the cluster's S3 gateway (a folder of DIR without one). Exits 2 when
    anything is unrecoverable, 3 when the cluster refused a request of the job."""
    with _refusals_fail():
        cluster = cluster_id if cluster_id is not None else int(_tinker_config(dir).get("cluster_id", 1))
        _inspect_run(out_, master, deep, repair, settle, delete_delay, repair_rate, deep_rate, input_, export_timeout,
                     grant_ttl, conf, dir, clustermgr, _export_access(dir, s3), cluster)


def _inspect_run(out_: str, master: str, deep: bool, repair: bool, settle: float, delete_delay: float,
                 repair_rate: float, deep_rate: float, input_: str, export_timeout: float, grant_ttl: float,
                 conf: list[str] | None, dir: Path, clustermgr: str, bucket: S3Access | None, cluster_id: int) -> None:
    from blobstore_server.spark.inputs import export_all, load_inputs
    from blobstore_server.spark.inspect import InspectOptions, inspect, write_text
    from blobstore_server.spark.repair import queue_all, requests
    from blobstore_server.spark.session import spark_session

    target = _absolute(out_ or (f"{EXPORT_ROOT}inspect" if bucket else str(dir / "inspect")))
    source = _absolute(input_) if input_ else f"{target.rstrip('/')}/input"
    if not any(where.startswith("s3://") for where in (target, source)):
        bucket = None  # a folder: Spark needs no S3A connector
    hosts = clustermgr_urls(dir, clustermgr)
    if not input_:
        err.print(f"exporting clustermgr's tables and every disk's shard index to {source}")

        async def export() -> Any:
            async with ClusterClient(hosts) as cm, BlobnodeClient() as blobnodes:
                return await export_all(cm, blobnodes, source, export_timeout, bucket)

        report = asyncio.run(export())
        for host, why in report.failed_hosts.items():
            err.print(f"blobnode {host} did not export: {why}", style="yellow", markup=False)
    inputs = load_inputs(source, bucket)
    signer = auth.installed()
    grant = signer.grant(Capability.READ_SHARD, grant_ttl) if deep and signer is not None else None
    options = InspectOptions(settle=settle, delete_delay=delete_delay, deep=deep, deep_rate=deep_rate * 1e6,
                             deep_grant=grant, deep_ca=_pem(cluster_ca(dir)), s3=bucket)
    sized = {"spark.sql.shuffle.partitions": str(inputs.shuffle_partitions()), **_conf(conf)}
    with spark_session(master, "blobstore-inspect", sized, s3=bucket) as spark:
        summary = inspect(spark, inputs, target, options)
        if repair:
            loop = asyncio.new_event_loop()
            cm = ClusterClient(hosts)
            mq = MqProxyClient(cluster=cm, intents=operator_intents(dir, cluster_id))  # any live mqproxy it knows
            try:
                queued = queue_all(loop, mq, requests(spark, target), repair_rate)
            finally:
                loop.run_until_complete(mq.close())
                loop.run_until_complete(cm.close())
                loop.close()
            summary["queued"] = {"repairs": queued.repairs, "deletes": queued.deletes}
            write_text(target, "summary.json", json.dumps(summary, indent=2, sort_keys=True), bucket)
    _print_inspection(summary, target)
    if summary["unrecoverable"]:
        raise typer.Exit(UNRECOVERABLE_EXIT)


def _print_inspection(summary: dict[str, Any], target: str) -> None:
    from blobstore_server.spark.rules import Finding

    rows = [{"finding": f.value, "count": summary[f.value]} for f in Finding if f.value in summary]
    emit(rows, False, title="inspection findings")
    out.print(f"volumes: {summary['volumes_scanned']} scanned, {summary['volumes_unavailable']} partly unavailable, "
              f"{summary['volumes_skipped']} skipped (migrating); blobs: {summary['blobs_scanned']} scanned, "
              f"{summary['blobs_recent']} too recent; bytes at risk: {summary['bytes_at_risk']}")
    for disk in summary["disks_unavailable"]:
        out.print(f"disk {disk['disk_id']} ({disk['host']}) unavailable: {disk['reason']}", markup=False)
    if "queued" in summary:
        out.print(f"queued {summary['queued']['repairs']} repairs and {summary['queued']['deletes']} deletes")
    out.print(f"findings and summary.json in {target}")


@inspect_app.command("backlog")
def inspect_backlog(out_: OutOpt = "", master: MasterOpt = "local[*]",
                    kafka: Annotated[str, typer.Option(help="Kafka bootstrap HOST:PORT [default: cluster.json].")] = "",
                    cluster_id: Annotated[int | None, typer.Option(
                        help="Count this cluster's messages [default: tinker's config in DIR].")] = None,
                    group_prefix: Annotated[str, typer.Option(help="tinker group_prefix [default: its config].")] = "",
                    window: Annotated[float, typer.Option(help="Seconds of finished tasks for the rate.")] = 3600.0,
                    stall_after: Annotated[float, typer.Option(
                        help="Seconds without progress after which a backlog is stalled.")] = 300.0,
                    conf: ConfOpt = None, as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR,
                    clustermgr: CmOpt = "", kafka_user: KafkaUserOpt = "") -> None:
    """Unconsumed repair and delete messages (Spark's Kafka source) and open scheduler tasks: counts by type,
    disk, volume and age, the oldest item, drain rate, ETA and stalled flags."""
    from blobstore_server.spark.backlog import BacklogOptions, backlog, gather
    from blobstore_server.spark.session import spark_session

    tinker = _tinker_config(dir)
    options = BacklogOptions(bootstrap=kafka_bootstrap(dir, kafka),
                             cluster_id=cluster_id if cluster_id is not None else int(tinker.get("cluster_id", 1)),
                             group_prefix=group_prefix or str(tinker.get("group_prefix", "tinker")),
                             window=window, stall_after=stall_after, auth=kafka_login(dir, kafka, kafka_user))
    target = _absolute(out_ or str(dir / "backlog"))
    with _refusals_fail():
        gathered = on_cluster(dir, clustermgr, lambda cm: gather(cm, options, target))
        with spark_session(master, "blobstore-backlog", _conf(conf), kafka_source=True) as spark:
            summary = backlog(spark, gathered, target, options)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    emit([{"task": task.value, "backlog": s["backlog"], "oldest_s": _seconds(s["oldest_age_s"]),
            "rate_per_s": f"{s['rate_per_s']:.2f}", "eta_s": _seconds(s["eta_s"]), "paused": s["paused"],
            "stalled": s["stalled"], "stuck_tasks": s["stuck_tasks"]}
           for task in TaskType if (s := summary[task.value])], False, title="repair backlog")
    out.print(f"tables and summary.json in {target}")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"

