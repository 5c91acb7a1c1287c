"""The `blobstore` command: run a local cluster, store, read and delete objects, inspect shards, disks, volumes,
config and the repair/delete queues.

Commands find the access and clustermgr URLs in `--dir`'s cluster.json unless `--access` / `--clustermgr`
name them. Every expected failure prints one `error:` line on stderr and exits 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

from blobstore import Client
from blobstore.errors import NotFound
from blobstore_server.cli.auth_cli import auth_app
from blobstore_server.cli.cli_common import (
    AccessOpt,
    CmOpt,
    CommandGroup,
    DirOpt,
    JsonOpt,
    KafkaUserOpt,
    disk_app,
    emit,
    err,
    kafka_bootstrap,
    kafka_login,
    on_cluster,
    operator_grant,
    out,
    sdk,
    sub_app,
    tinker_url,
    volume_app,
)
from blobstore_server.cli.deploy_cli import deploy_app
from blobstore_server.cli.durability_cli import durability_app
from blobstore_server.cli.inspect_cli import inspect_app
from blobstore_server.cli.s3_cli import s3_app
from blobstore_server.cli.shards import inspect_shards
from blobstore_server.cli.task_cli import task_app
from blobstore_server.cluster.launcher import CA_ENV, DEFAULT_DIR, down, status, up
from blobstore_server.cluster.plan import LOCAL_BROKEN_AFTER, ClusterShape
from blobstore_server.cluster.procs import poll
from blobstore_server.libs.ec import parse_code_mode
from blobstore_server.libs.mq.admin import lag
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.mq.topics import pipelines
from blobstore_server.libs.proto.cluster import DiskStatus, VolumeStatus
from blobstore_server.libs.proto.runtime_keys import runtime_keys_help
from blobstore_server.libs.proto.scheduler import DEFAULT_BROKEN_AFTER
from blobstore_server.libs.proto.tinker import TinkerStats
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.tinker.client import TinkerClient

COUNTERS = ("messages_in", "done", "failed", "retried", "undeleted")
GRANT_TTL = 300.0  # seconds the operator's undelete grant lasts (each request's signature: a minute)
app = typer.Typer(cls=CommandGroup, help=__doc__, no_args_is_help=True, pretty_exceptions_show_locals=False)
cluster_app, blob_app = sub_app("Run a local cluster."), sub_app("Look inside stored objects.")
config_app = sub_app("Cluster configuration.")
queue_app = sub_app("The repair and delete queues in Kafka, and tinker's work on them.")
for sub, name in ((cluster_app, "cluster"), (blob_app, "blob"), (disk_app, "disk"), (volume_app, "volume"),
                  (config_app, "config"), (queue_app, "queue")):
    app.add_typer(sub, name=name)

@contextmanager
def _progress_bar(what: str) -> Iterator[Callable[[int, int], None]]:
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=err, transient=False) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _parse_range(text: str) -> tuple[int, int | None]:
    """`a-b` (inclusive) or `a-` -> (offset, size or None)."""
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not (last.isdigit() or last == ""):
        raise typer.BadParameter(f"{text!r} is not a-b or a-", param_hint="--range")
    if last and int(last) < int(first):
        raise typer.BadParameter(f"{text!r}: the last byte is before the first", param_hint="--range")
    return int(first), int(last) - int(first) + 1 if last else None


# cluster


@cluster_app.command("up")
def cluster_up(dir: DirOpt = DEFAULT_DIR, blobnodes: int = 6, disks_per_node: int = 2, code_mode: str = "EC3P3",
               delete_delay: Annotated[float, typer.Option(
                   help="Seconds from a delete to its space coming back (tinker's safe delay).")] = 60.0,
               clusters: Annotated[int, typer.Option(
                   min=1, max=8, help="A region: K clusters behind the access nodes, sharing Kafka and Redis.")] = 1,
               disk_broken_after: Annotated[float, typer.Option(
                   min=0, help="Seconds without a heartbeat before a disk is repaired unattended; 0: never "
                               f"(production configs: {DEFAULT_BROKEN_AFTER:.0f}).")] = LOCAL_BROKEN_AFTER,
               hosts: Annotated[int, typer.Option(
                   min=0, max=200, help="Run on N hosts, each a network namespace with its own address (root); "
                                        "every host runs a blobnode [default: all on 127.0.0.1].")] = 0,
               racks: Annotated[int, typer.Option(min=1, help="With --hosts: racks, taken by hosts in turn.")] = 2,
               timeout: float = 60.0) -> None:
    """Start redis, Kafka, 3 clustermgr, blobnodes, two allocators, two schedulers (one stands by), a worker,
    mqproxy, tinker, two access nodes and a dashboard on 127.0.0.1 (or on --hosts N network namespaces, from the
    bundles rendered under DIR/<host>/), detached; print the access URLs, one a line."""
    shape = ClusterShape(hosts or blobnodes, disks_per_node, parse_code_mode(code_mode), delete_delay=delete_delay,
                         clusters=clusters, disk_broken_after=disk_broken_after or None)
    info = up(dir, shape, hosts=hosts, racks=racks, timeout=timeout, say=err.print)
    if disk_broken_after:
        err.print(f"a disk silent for {disk_broken_after:.0f} s is repaired unattended (production default "
                  f"{DEFAULT_BROKEN_AFTER:.0f} s; --disk-broken-after 0 turns it off)")
    err.print(f"{len(info.processes)} processes in {info.dir}/ (cluster.json, one folder each with its log)")
    err.print(f"stop it with: blobstore cluster down --dir {dir}")
    for url in info.access_urls:  # the first line is the first access node's, as when there was one
        typer.echo(url)


@cluster_app.command("down")
def cluster_down(dir: DirOpt = DEFAULT_DIR, timeout: float = 10.0) -> None:
    """Stop every process `cluster up` started in DIR, by PID (SIGTERM, then SIGKILL)."""
    for record, outcome in down(dir, timeout):
        out.print(f"{record.name:12} pid {record.pid:<8} {outcome}")
    out.print(f"cluster in {dir}/ is down")


@cluster_app.command("status")
def cluster_status(dir: DirOpt = DEFAULT_DIR, as_json: JsonOpt = False) -> None:
    """Each process (role, host, pid, address, healthy) and which clustermgr leads (each cluster's, in a region)."""
    state = status(dir)
    if as_json:
        typer.echo(json.dumps(asdict(state), indent=2))
        return
    emit([{"role": p.role, "name": p.name, **({"host": p.host} if p.host else {}), "pid": p.pid,
            "address": p.url.split("://", 1)[1].split("/", 1)[0],
            "healthy": "yes" if p.healthy else ("no" if p.running else "stopped")} for p in state.processes], False)
    out.print(f"leader: {state.leader or 'none'}    access: {', '.join(state.access_urls)}")
    for cluster_id, leader in state.leaders.items():
        out.print(f"cluster {cluster_id}: leader {leader or 'none'}")
    out.print(f"dashboard: {state.dashboard or 'none'}")


# objects


@app.command()
def put(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
        code_mode: Annotated[str, typer.Option(help="e.g. EC6P3 [default: the cluster's size policy]")] = "",
        parallel: Annotated[int, typer.Option(min=1, max=64, help="upload up to K parts (blobs) at once")] = 1,
        dir: DirOpt = DEFAULT_DIR, access: AccessOpt = "") -> None:
    """Store FILE and print its location."""
    with sdk(dir, access) as client, open(file, "rb") as f, _progress_bar(f"put {file.name}") as report:
        location = client.put(f, code_mode=code_mode or None, progress=report, parallel=parallel)
    typer.echo(location)


@app.command()
def get(location: str, output: Annotated[Path | None, typer.Option("-o", "--output", help="[default: stdout]")] = None,
        range_: Annotated[str, typer.Option("--range", help="bytes a-b (inclusive) or a-")] = "",
        dir: DirOpt = DEFAULT_DIR, access: AccessOpt = "") -> None:
    """Read an object (or a byte range of it) to a file or stdout."""
    offset, size = _parse_range(range_) if range_ else (0, None)
    with sdk(dir, access) as client:
        if output is None:
            for piece in client.get_stream(location, offset, size):
                sys.stdout.buffer.write(piece)
            sys.stdout.buffer.flush()
            return
        with _progress_bar(f"get {output.name}") as report:
            written = client.get_to_file(location, output, report, offset=offset, size=size)
    err.print(f"wrote {written} bytes to {output}")


@app.command()
def stat(location: str, dir: DirOpt = DEFAULT_DIR, access: AccessOpt = "", as_json: JsonOpt = False) -> None:
    """What the location says: size, CRC, code mode, its cluster and its blobs."""
    with sdk(dir, access) as client:
        found = client.stat(location)
    if as_json:
        typer.echo(found.model_dump_json(indent=2))
        return
    out.print(f"size {found.size}  crc {found.crc}  code mode {found.code_mode}  cluster {found.cluster_id}  "
              f"blob size {found.blob_size}")
    emit([{"vid": s.vid, "first bid": s.min_bid, "blobs": s.count} for s in found.blobs], False)


@app.command("del")
def delete(location: str, wait: Annotated[float, typer.Option(
               help="Seconds to wait until reads of it fail [default: return once queued].")] = 0.0,
           dir: DirOpt = DEFAULT_DIR, access: AccessOpt = "") -> None:
    """Delete an object: queued at once; reads fail once tinker marked its blobs (seconds), and the space
    comes back after the safe delay."""

    def missing(client: Client, offset: int) -> bool:
        try:
            client.get(location, offset, 1)
        except NotFound:
            return True
        return False

    with sdk(dir, access) as client:
        info = client.stat(location)
        client.delete(location)
        out.print("delete queued")
        # One byte of every blob: tinker marks blobs one by one, and a 0-byte object has none to wait for.
        offsets = range(0, info.size, info.blob_size)
        if wait:
            if not poll(lambda: all(missing(client, offset) for offset in offsets), wait, interval=0.2):
                raise TimeoutError(f"reads of it still succeed after {wait:g}s: is tinker running?")
            out.print("deleted: reads of it now answer not found")


@queue_app.command("stats")
def queue_stats(as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR,
                kafka: Annotated[str, typer.Option(help="Kafka bootstrap HOST:PORT [default: cluster.json].")] = "",
                tinker: Annotated[str, typer.Option(help="tinker URL [default: cluster.json].")] = "",
                group_prefix: Annotated[str, typer.Option(help="tinker's group_prefix.")] = "tinker",
                kafka_user_: KafkaUserOpt = "") -> None:
    """Lag per topic and partition of tinker's consumer groups, and tinker's in/done/failed/retried counters."""
    bootstrap, tinker = kafka_bootstrap(dir, kafka), tinker_url(dir, tinker)

    async def tinker_stats() -> TinkerStats:
        async with TinkerClient() as client:
            return await client.stats(tinker)

    try:
        counters: TinkerStats | None = asyncio.run(tinker_stats())
    except RpcError as exc:  # the lag is what matters most when tinker is down
        err.print(f"tinker at {tinker} did not answer ({exc}): no counters", style="yellow")
        counters = None
    specs = pipelines(group_prefix)
    login = client_auth(kafka_login(dir, kafka, kafka_user_))
    lags = {spec.name: lag(bootstrap, spec.group, [str(t) for t in spec.topics], client=login) for spec in specs}
    found = {spec.name: counters.pipelines.get(spec.name) if counters is not None else None for spec in specs}
    if as_json:
        typer.echo(json.dumps({spec.name: {"group": spec.group, "lag": lags[spec.name],
                                           **(c.model_dump(include=set(COUNTERS)) if (c := found[spec.name]) else {})}
                               for spec in specs}, indent=2))
        return
    emit([{"group": spec.group, "topic": topic, "partition": partition, "lag": n}
           for spec in specs for topic, parts in lags[spec.name].items() for partition, n in parts.items()],
          False, title=f"consumer lag at {bootstrap}")
    emit([{"pipeline": spec.name, **{k: getattr(c, k) if (c := found[spec.name]) else "?" for k in COUNTERS},
            "lag": sum(n for parts in lags[spec.name].values() for n in parts.values())} for spec in specs],
          False, title=f"tinker at {tinker_url}")


@blob_app.command("shards")
def blob_shards(location: str, as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR, access: AccessOpt = "",
                clustermgr: CmOpt = "") -> None:
    """Every shard of every blob: index, vuid, disk, host, and present / missing / corrupt."""
    with sdk(dir, access) as client:
        info = client.stat(location)

    async def run(cm: ClusterClient) -> list[dict[str, object]]:
        async with BlobnodeClient() as blobnodes:
            return [asdict(r) for r in await inspect_shards(info, cm, blobnodes)]

    emit(on_cluster(dir, clustermgr, run), as_json, title=f"{info.code_mode} shards")


@blob_app.command("undelete")
def blob_undelete(location: str, as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR, access: AccessOpt = "") -> None:
    """Take a DELETE back within its safe delay: the object reads back (its lost shards, if any, are repaired).
    After the delay it answers not found (purged). Signed with the cluster secret, as the operator."""
    with sdk(dir, access, grant=operator_grant(dir, Capability.UNDELETE, GRANT_TTL)) as client:
        result = client.undelete(location)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    if not result.unmarked and not result.missing:
        out.print("undeleted: no delete had reached its shards yet; any delete of it issued so far is taken back")
        return
    shown = f"undeleted: {result.unmarked} shard(s) of {result.blobs} blob(s) unmarked"
    if result.missing:
        shown += f"; {result.missing} already gone, repairs queued (it reads back meanwhile)"
    if result.unreachable:
        shown += f"; {result.unreachable} on blobnodes that did not answer (tinker unmarks them once they do)"
    out.print(shown)


# disks, volumes, config


@disk_app.command("list")
def disk_list(as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Every disk clustermgr knows, with whether its blobnode heartbeats, its free bytes, the bytes in its trash
    (released or compacted away, removed after the blobnode's trash_hold), and by how many seconds its scrub pass
    ends late even at scrub_mb_per_sec (above 0: raise the cap or the scrub period)."""
    disks = on_cluster(dir, clustermgr, lambda cm: cm.list_disks())
    keys = {"disk_id", "host", "path", "status", "readonly", "alive", "chunks", "free", "trash_bytes", "scrub_late_s"}
    emit([d.model_dump(mode="json", include=None if as_json else keys) for d in disks], as_json)


@disk_app.command("set")
def disk_set(disk_id: int, status_: Annotated[DiskStatus | None, typer.Option("--status", help="e.g. broken")] = None,
             readonly: Annotated[bool | None, typer.Option("--readonly/--writable")] = None,
             dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Change a disk's status or readonly flag."""
    disk = on_cluster(dir, clustermgr, lambda cm: cm.set_disk(disk_id, status=status_, readonly=readonly))
    typer.echo(disk.model_dump_json(indent=2))


@volume_app.command("list")
def volume_list(status_: Annotated[VolumeStatus | None, typer.Option("--status", help="idle, active or lock")] = None,
                as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Every volume: code mode, status, capacity, use, lease, and whether new blobs may go to it (why not)."""
    volumes = on_cluster(dir, clustermgr, lambda cm: cm.list_volumes(status_))
    if as_json:
        emit([v.model_dump(mode="json") for v in volumes], True)
        return
    emit([{"vid": v.vid, "code_mode": v.code_mode.name, "status": v.status.value,
            "units": len(v.units), "capacity": v.capacity, "used": v.used, "lease_holder": v.lease_holder,
            "writable": "yes" if v.writable else f"no: {v.why_not}"} for v in volumes], False)


@volume_app.command("get")
def volume_get(vid: int, as_json: JsonOpt = False, dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """One volume and where each of its units lives."""
    volume = on_cluster(dir, clustermgr, lambda cm: cm.get_volume(vid))
    if as_json:
        typer.echo(volume.model_dump_json(indent=2))
        return
    out.print(f"volume {volume.vid}: {volume.code_mode.name}, {volume.status.value}, "
              f"used {volume.used} of {volume.capacity}, lease holder {volume.lease_holder or '-'}")
    emit([{"index": i, **u.model_dump()} for i, u in enumerate(volume.units)], False)


@config_app.command("get")
def config_get(key: Annotated[str, typer.Argument(help="[default: list every key]")] = "",
               dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    """Print one config value, or every key and value."""
    if key:
        value = on_cluster(dir, clustermgr, lambda cm: cm.get_config(key))
        if value is None:
            raise ValueError(f"config key {key!r} is not set")
        typer.echo(value)
        return
    emit([{"key": k, "value": v} for k, v in on_cluster(dir, clustermgr, lambda cm: cm.list_config()).items()],
          False)


@config_app.command("set", help=f"Set a config value through the Raft log.\n\nKEY is one of:\n\n{runtime_keys_help()}")
def config_set(key: str, value: str, dir: DirOpt = DEFAULT_DIR, clustermgr: CmOpt = "") -> None:
    on_cluster(dir, clustermgr, lambda cm: cm.set_config(key, value))
    out.print(f"{key} set")


# The Spark jobs, background tasks, deploy, durability and auth commands live in their own modules.
app.add_typer(inspect_app, name="inspect")
app.add_typer(task_app, name="task")
app.add_typer(deploy_app, name="deploy")
app.add_typer(durability_app, name="durability")
app.add_typer(auth_app, name="auth")
app.add_typer(s3_app, name="s3")


@app.callback()
def options(ca: Annotated[Path | None, typer.Option(
        "--ca", envvar=CA_ENV, exists=True, dir_okay=False,
        help="The cluster CA's certificate, which https:// services are checked against (default: --dir's ca.pem)."
        )] = None) -> None:
    if ca is not None:  # read where a command reaches the cluster (launcher.cluster_ca)
        os.environ[CA_ENV] = str(ca)


def main() -> None:
    app()
