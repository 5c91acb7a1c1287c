"""A whole cluster as detached processes, recorded in DIR/cluster.json and stopped by PID: on 127.0.0.1 (a
"host" is a port), or with `hosts=N` on N hosts, each a network namespace (cluster/netns.py) running the
processes its rendered bundle (cluster/render.py, under DIR/<host>/) describes.

Kafka is one of them: kafka_broker.py starts each broker's JVM and stops it (by the PID in its
folder's kafka.pid); on three or more hosts three brokers form a KRaft quorum.

`up` starts it stage by stage and returns once a first PUT succeeds through every access node (clustermgr
creates volumes and the allocators lease them in the background; the plan tells clustermgr to create none
before every disk it starts has registered, so no volume doubles up on the hosts that came first); `down`
stops what `up` started; `status` says what runs.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx
import tomli_w
from confluent_kafka import KafkaException

from blobstore import Client
from blobstore.errors import BlobstoreError
from blobstore_server.cluster import kafka_auth, netns, pki, render
from blobstore_server.cluster import kafka_broker as broker
from blobstore_server.cluster.netns import Network
from blobstore_server.cluster.plan import (
    HOST,
    LOCAL_HOST,
    STAGES,
    ClusterPlan,
    ClusterShape,
    KafkaPlan,
    ProcessSpec,
    plan_cluster,
    plan_spec,
    port_count,
)
from blobstore_server.cluster.procs import free_ports, healthy, poll, running, spawn, start_time, stop
from blobstore_server.cluster.spec import SpecError, for_hosts
from blobstore_server.libs import cpugroup
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.proto import clustermgr as clustermgr_api
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc import client as rpc_client
from blobstore_server.libs.rpc.auth import AUTH_HEADER, SECRET_ENV, new_secret, operator_signer

DEFAULT_DIR = Path("run")
STATE_FILE = "cluster.json"
SECRET_FILE = "cluster.secret"  # the secret every role key derives from; mode 0600, like the configs
IMPORT_ROOT = Path(__file__).resolve().parents[2]  # where blobstore_server imports from: a checkout or site-packages
SPEC_FILE = "cluster.toml"  # the spec `up(hosts=N)` rendered the hosts' bundles from
CA_ENV = "BLOBSTORE_CA"  # the cluster CA's certificate for a CLI without the cluster folder (whose ca.pem it is)
Say = Callable[[str], object]


class LauncherError(Exception):
    """The cluster could not be started, found or stopped; the message says why and where to look."""


@dataclass(frozen=True)
class ProcessRecord:
    role: str
    name: str
    pid: int
    started: int  # kernel start time: a recycled pid is never mistaken for this process
    port: int
    url: str
    config: str
    log: str
    command: list[str] = field(default_factory=list)  # empty in a cluster.json written before it was kept
    host: str = ""  # the host it runs on, in a cluster of several
    namespace: str = ""  # that host's network namespace, which `command` runs in

    @property
    def running(self) -> bool:
        return running(self.pid, self.started)

    @property
    def wrap(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.namespace) if self.namespace else ()


@dataclass
class ClusterInfo:
    dir: str
    access_url: str  # the first access node's, for callers that want one; `access_urls` names them all
    clustermgr_urls: list[str]
    redis_url: str
    code_mode: str
    kafka_bootstrap: str = ""  # empty in a cluster.json written before the launcher started Kafka
    processes: list[ProcessRecord] = field(default_factory=list)
    dashboard_url: str = ""  # empty in a cluster.json written before the launcher started a dashboard
    region: dict[str, list[str]] = field(default_factory=dict)  # cluster id -> its clustermgr URLs, when several
    access_urls: list[str] = field(default_factory=list)  # every access node's, in order (access1, access2, ...)
    network: str = ""  # the network namespaces' prefix (bs<k>) of a cluster of several hosts
    hosts: int = 0  # how many hosts it has; 0: all on 127.0.0.1

    @property
    def ca(self) -> str | None:
        """The cluster CA's certificate its https services are checked against (`up --hosts` writes it to the
        folder); None: a plaintext cluster."""
        path = Path(self.dir) / pki.CA_FILE
        return str(path) if path.exists() else None

    @property
    def kafka_ca(self) -> str | None:
        """The CA its Kafka brokers (and Redis) are checked against: they take TLS on a cluster of several hosts
        only (the certificate of a cluster on 127.0.0.1, `ClusterShape.tls`, is its HTTP services' and Raft's)."""
        return self.ca if self.hosts else None

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What httpx checks the cluster's https services with (its `verify=`)."""
        return ssl.create_default_context(cafile=self.ca) if self.ca else True

    def net(self) -> Network | None:
        """Its hosts' namespaces and addresses (host -> namespace, address; each process names its host)."""
        return netns.plan_network(self.hosts, int(self.network[2:])) if self.network else None

    def on_host(self, host: str) -> list[ProcessRecord]:
        """The processes running on `host` (h1, h2, ...)."""
        return [p for p in self.processes if p.host == host]

    def save(self) -> None:
        path = Path(self.dir) / STATE_FILE
        path.with_suffix(".tmp").write_text(json.dumps(asdict(self), indent=2))
        os.replace(path.with_suffix(".tmp"), path)

    @classmethod
    def load(cls, root: Path) -> ClusterInfo:
        """The cluster recorded under `root`; from now on this process signs its requests as the operator and
        trusts the cluster's CA."""
        sign_as_operator(root)
        trust_cluster(root)
        path = root / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise LauncherError(f"no cluster in {root}/ (no {STATE_FILE}): run `blobstore cluster up`") from None
        raw["processes"] = [ProcessRecord(**p) for p in raw["processes"]]
        raw["access_urls"] = raw.get("access_urls") or [raw["access_url"]]  # written when `up` started one access
        return cls(**raw)


@dataclass(frozen=True)
class ProcessStatus:
    role: str
    name: str
    pid: int
    port: int
    url: str
    running: bool
    healthy: bool
    host: str = ""


@dataclass(frozen=True)
class ClusterStatus:
    dir: str
    access_url: str  # the first of `access_urls`
    leader: str | None  # name of the clustermgr that leads, None while there is none
    processes: list[ProcessStatus]
    dashboard: str | None  # the dashboard's URL, None in a cluster started without one
    leaders: dict[str, str | None] = field(default_factory=dict)  # per cluster id, in a region
    access_urls: list[str] = field(default_factory=list)  # every access node's


def _child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{IMPORT_ROOT}{os.pathsep}{path}" if path else str(IMPORT_ROOT)}


def _clear_stopped(root: Path, say: Say) -> None:
    """Refuse while a cluster runs in `root`; wipe the folders of one that was stopped."""
    if not (root / STATE_FILE).exists():
        return
    old = ClusterInfo.load(root)
    alive = [p for p in old.processes if p.running]
    if alive:
        raise LauncherError(f"a cluster already runs in {root}/ (pids {', '.join(str(p.pid) for p in alive)}); "
                            f"stop it first: blobstore cluster down --dir {root}")
    if old.network:
        netns.destroy(old.network)
    for p in old.processes:
        shutil.rmtree(root / p.name, ignore_errors=True)
    for host in {p.host for p in old.processes if p.host}:
        shutil.rmtree(root / host, ignore_errors=True)
    (root / STATE_FILE).unlink()
    say(f"wiped the stopped cluster's data in {root}/")


def cluster_secret(root: Path | None) -> str | None:
    """The cluster secret of $BLOBSTORE_SECRET, else of the cluster folder `root`; None without either."""
    secret = os.environ.get(SECRET_ENV)
    if secret is None and root is not None and (root / SECRET_FILE).exists():
        secret = (root / SECRET_FILE).read_text()
    return None if secret is None else secret.strip()


def sign_as_operator(root: Path | None) -> bool:
    """Sign every request of this process with every role (the operator's CLI, a test, a benchmark), the
    secret read from $BLOBSTORE_SECRET or the cluster folder; whether one was found."""
    signer = operator_signer(cluster_secret(root))
    if signer is None:
        return False
    auth.install(signer)
    return True


def cluster_ca(root: Path | None) -> str | None:
    """The cluster CA's certificate clients check its services against: $BLOBSTORE_CA, else the cluster folder's
    ca.pem (`up --hosts` writes it); None: the system's roots (a cluster on 127.0.0.1 is plaintext and needs none)."""
    ca = os.environ.get(CA_ENV)
    if ca is None and root is not None and (root / pki.CA_FILE).exists():
        ca = str(root / pki.CA_FILE)
    return ca


def trust_cluster(root: Path | None) -> str | None:
    """Check https:// services against `cluster_ca(root)` in this process's RPC clients from now on; that CA."""
    ca = cluster_ca(root)
    rpc_client.trust(ca)
    return ca


def _private(path: Path, text: str) -> None:
    """Write a file only its owner may read (it holds keys)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def _start(spec: ProcessSpec, env: dict[str, str], namespace: str) -> ProcessRecord:
    spec.workdir.mkdir(parents=True, exist_ok=True)
    spec.config_path.parent.mkdir(parents=True, exist_ok=True)
    _private(spec.config_path, spec.config_text)
    record = ProcessRecord(spec.role, spec.name, 0, 0, spec.port, spec.url, str(spec.config_path),
                           str(spec.log_path), list(spec.command), spec.host, namespace)
    pid, started = spawn([*record.wrap, *spec.command], spec.log_path, spec.workdir, env)
    return replace(record, pid=pid, started=started)


def _start_kafka(kafka: KafkaPlan, namespaces: dict[str, str], timeout: float, secret: str,
                 group_prefixes: list[str], tls: dict[str, pki.HostTLS], ca_file: str | None) -> list[ProcessRecord]:
    """Every broker, and wait until they serve together (a quorum member cannot serve alone); kafka_broker.py stops
    a broker that did not come up. Clients log in with SASL/SCRAM as the users cluster/kafka_auth.py derives
    from `secret`, over TLS when the brokers' hosts have certificates (`tls`, and `ca_file` the CA the launcher
    trusts); once the brokers serve, the launcher (as admin) gives each user its ACLs."""
    records = []
    users = kafka_auth.scram_users(secret)
    admin = client_auth(kafka_auth.kafka_user(secret, kafka_auth.ADMIN, ca_file))
    try:
        broker.fetch()
        for b in kafka.brokers:
            namespace = namespaces.get(b.place.host, "")
            record = ProcessRecord("kafka", b.place.name, 0, 0, b.place.port, f"kafka://{b.place.bind}",
                                   str(b.place.workdir / "server.properties"), str(b.place.workdir / "kafka.log"),
                                   host=b.place.host, namespace=namespace)
            pid, _ = broker.start(b.place.workdir, b.place.port, b.place.second_port, address=b.place.address,
                                  node_id=b.node_id, voters=kafka.voters,
                                  replication_factor=kafka.replication_factor,
                                  min_insync_replicas=kafka.min_insync_replicas,
                                  cluster_uuid=kafka.cluster_uuid or None, wrap=record.wrap,
                                  wait=len(kafka.brokers) == 1, users=users, admin=kafka_auth.ADMIN,
                                  tls=tls.get(b.place.host), client=admin)
            records.append(replace(record, pid=pid, started=start_time(pid) or 0))
        if len(kafka.brokers) > 1:
            broker.wait_serving(kafka.bootstrap, timeout, brokers=len(kafka.brokers),
                                directories=[b.place.workdir for b in kafka.brokers], client=admin)
        kafka_auth.apply_acls(kafka.bootstrap, secret, group_prefixes, timeout, ca_file)
    except (RuntimeError, OSError, subprocess.CalledProcessError, KafkaException) as exc:
        for r in records:
            broker.stop(Path(r.config).parent)
        raise LauncherError(f"Kafka: {exc} (logs in {', '.join(str(Path(r.log).parent) for r in records)})") from exc
    return records


def _stop_all(info: ClusterInfo, timeout: float) -> dict[str, str]:
    """Every process by PID, Kafka last: tinker and mqproxy leave their group and flush while it still runs."""
    records = [p for p in info.processes if p.role != "kafka"]
    outcome = stop([(p.pid, p.started) for p in records], timeout)
    result = {p.name: outcome[p.pid] for p in records}
    brokers = [p for p in info.processes if p.role == "kafka"]
    for p in brokers:
        result[p.name] = "stopped" if p.running else "was not running"
    with ThreadPoolExecutor(max(1, len(brokers))) as pool:  # each takes seconds to flush and leave
        list(pool.map(lambda p: broker.stop(Path(p.config).parent, timeout), brokers))
    return result


def _wait_healthy(records: list[ProcessRecord], timeout: float, verify: ssl.SSLContext | bool) -> None:
    pending = list(records)

    def check() -> bool:
        for record in list(pending):
            if not record.running:
                tail = Path(record.log).read_text(errors="replace")[-2000:]
                raise LauncherError(f"{record.name} exited during start; the end of {record.log}:\n{tail}")
            if healthy(record.url, verify=verify):
                pending.remove(record)
        return not pending

    if not poll(check, timeout, interval=0.1):
        raise LauncherError(f"not healthy after {timeout:.0f}s: "
                            + ", ".join(f"{r.name} (log {r.log})" for r in pending))


def _wait_first_put(access_urls: list[str], timeout: float, ca: str | None) -> None:
    """Volumes are created and leased in the background: poll until a PUT and its read-back succeed through
    each access node in turn (each one's client talks to that node only), waiting up to `timeout` for each."""
    probe = b"blobstore cluster up probe"
    failure: list[str] = []

    def put_ok(client: Client) -> bool:
        try:
            return client.get(client.put(probe)) == probe
        except BlobstoreError as exc:
            failure[:] = [str(exc)]
            return False

    for url in access_urls:
        with Client([url], timeout=10.0, ca=ca) as client:
            if not poll(lambda: put_ok(client), timeout, interval=0.25):
                raise LauncherError(f"no PUT through {url} succeeded within {timeout:.0f}s: "
                                    f"{failure[0] if failure else '?'}")


def _plan_hosts(root: Path, shape: ClusterShape, hosts: int, racks: int, auth_secret: str) -> tuple[ClusterPlan,
                                                                                                     Network]:
    """A spec for `hosts` namespaces (written to DIR/cluster.toml), its plan, and each host's bundle rendered
    under DIR/<host>/; the processes then run from those bundles' configs."""
    netns.require_root()
    if shape.clusters != 1:
        raise LauncherError("a region (--clusters) runs on 127.0.0.1 only, not with --hosts")
    net = netns.plan_network(hosts, netns.free_index())
    try:
        spec = for_hosts([(h.name, h.address) for h in net.hosts], racks, root, disks_per_host=shape.disks_per_node,
                         code_modes=[shape.code_mode], volumes_per_mode=shape.min_volumes,
                         chunk_size=shape.chunk_size, delete_delay=shape.delete_delay,
                         disk_broken_after=shape.disk_broken_after, python=sys.executable)
    except SpecError as exc:
        raise LauncherError(str(exc)) from None
    (root / SPEC_FILE).write_text(tomli_w.dumps(spec.model_dump(mode="json", exclude_defaults=True)))
    plan = plan_spec(spec, sys.executable, auth_secret)
    render.write(root, render.bundle(spec, plan))  # with DIR/ca.pem, which the CLI and the launcher trust
    return plan, net


def up(root: Path = DEFAULT_DIR, shape: ClusterShape | None = None, *, hosts: int = 0, racks: int = 2,
       timeout: float = 60.0, say: Say = lambda _: None) -> ClusterInfo:
    """Start a cluster under `root` (on `hosts` network namespaces when > 0, as root) and return once it stores
    objects; on failure stop what was started."""
    shape = shape or ClusterShape()
    if shutil.which("redis-server") is None:
        raise LauncherError("redis-server is not installed (make setup installs it: apt-get install redis-server)")
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    _clear_stopped(root, say)
    (root / pki.CA_FILE).unlink(missing_ok=True)  # a former cluster's: this one's clients must not take it for theirs
    auth_secret = new_secret()
    _private(root / SECRET_FILE, auth_secret)
    sign_as_operator(root)
    net = None
    if hosts:
        plan, net = _plan_hosts(root, shape, hosts, racks, auth_secret)
    else:
        plan = plan_cluster(root, shape, iter(free_ports(port_count(shape))), sys.executable, secrets.token_hex(16),
                            auth_secret)
        if plan.tls:  # the certificate for 127.0.0.1 where `local_tls` says
            render.write(root, render.certificate_files(Path(), plan.tls[LOCAL_HOST]))
        else:
            say(f"plaintext on {HOST}: the processes of one machine talk without TLS (--hosts N encrypts every link)")
    access_urls = [spec.url for spec in plan.of_role("access")]
    clustermgrs = plan.clustermgr_urls()
    home = next(iter(clustermgrs))
    dashboards = plan.of_role("dashboard")
    info = ClusterInfo(str(root), access_urls[0], clustermgrs[home], plan.of_role("redis")[0].url, shape.code_mode.name,
                       plan.kafka.bootstrap, dashboard_url=dashboards[0].url if dashboards else "",
                       region={str(k): urls for k, urls in clustermgrs.items()} if len(clustermgrs) > 1 else {},
                       access_urls=access_urls, network=net.prefix if net else "", hosts=hosts)
    info.save()  # before the network exists: `down` removes what a killed `up` leaves
    rpc_client.trust(info.ca)  # this process's clients of the cluster from now on (as after ClusterInfo.load)
    namespaces = {h.name: h.namespace for h in net.hosts} if net else {}
    env = _child_env()
    try:
        if net:
            netns.create(net)
            say(f"{hosts} hosts: network namespaces {net.prefix}-h1..h{hosts} on bridge {net.bridge} "
                f"({net.hosts[0].address}..{net.hosts[-1].address})")
        for stage in STAGES:
            started = [_start(spec, env, namespaces.get(spec.host, "")) for spec in plan.processes
                       if spec.role in stage]
            info.processes.extend(started)
            info.save()
            if "kafka" in stage:
                say(f"starting kafka ({len(plan.kafka.brokers)} JVM(s): a few seconds)")
                brokers = _start_kafka(plan.kafka, namespaces, timeout, auth_secret,
                                       [json.loads(t.config_text)["group_prefix"] for t in plan.of_role("tinker")],
                                       plan.tls, info.kafka_ca)
                info.processes.extend(brokers)
                started.extend(brokers)
                info.save()
            say(f"started {', '.join(r.name for r in started)}")
            _wait_healthy(started, timeout, info.verify)
        _wait_first_put(info.access_urls, timeout, info.ca)
    except BaseException:
        _stop_all(info, 10.0)
        for b in plan.kafka.brokers:  # a broker interrupted before it was recorded; a no-op otherwise
            broker.stop(b.place.workdir)
        if net:
            netns.destroy(net.prefix)
        raise
    say(f"a first PUT succeeded through each access node; access at {', '.join(info.access_urls)}, "
        f"S3 at {', '.join(p.url for p in plan.of_role('s3'))}, dashboard at {info.dashboard_url}")
    return info


def restart(root: Path, *names: str, timeout: float = 30.0) -> list[ProcessRecord]:
    """Start the stopped (or killed) processes `names` of the cluster in `root` again, side by side, with the
    command and config each was started with (on its host), as a supervisor would; returns once all answer."""
    info = ClusterInfo.load(root)
    records = []
    for name in names:
        index = next((i for i, p in enumerate(info.processes) if p.name == name), None)
        if index is None:
            raise LauncherError(f"no process {name!r} in {root}/ (see blobstore cluster status)")
        old = info.processes[index]
        if old.running:
            raise LauncherError(f"{name} still runs (pid {old.pid}); stop it first")
        if old.role == "kafka":  # on its directory and its server.properties: topics and offsets kept
            pid = broker.relaunch(Path(old.config).parent, wrap=old.wrap)
            record = replace(old, pid=pid, started=start_time(pid) or 0)
            try:
                admin = kafka_auth.kafka_user((root / SECRET_FILE).read_text().strip(), kafka_auth.ADMIN,
                                              info.kafka_ca)
                broker.wait_serving(info.kafka_bootstrap, timeout, directories=[Path(old.config).parent],
                                    brokers=sum(p.role == "kafka" for p in info.processes), client=client_auth(admin))
            except RuntimeError as exc:
                raise LauncherError(f"{name}: {exc}") from exc
        elif old.command:
            pid, started = spawn([*old.wrap, *old.command], Path(old.log), Path(old.log).parent, _child_env())
            record = replace(old, pid=pid, started=started)
        else:
            raise LauncherError(f"{name} cannot be restarted: {STATE_FILE} does not say how it was started")
        info.processes[index] = record
        info.save()
        records.append(record)
    _wait_healthy(records, timeout, info.verify)
    return records


def down(root: Path = DEFAULT_DIR, timeout: float = 10.0) -> list[tuple[ProcessRecord, str]]:
    """Stop every process `up` recorded under `root`: SIGTERM, then SIGKILL after `timeout`."""
    info = ClusterInfo.load(root)
    outcome = _stop_all(info, timeout)
    if info.network:
        netns.destroy(info.network)
    group = cpugroup.idle_group_beside()  # the readers' and worker's, which stopping together may each leave busy
    if group is not None:
        cpugroup.remove_idle_group(group)  # unless another cluster's still run there
    return [(p, outcome[p.name]) for p in info.processes]


def _signed(method: str, url: str) -> dict[str, str]:
    """The headers of a bodiless request to a clustermgr signed as this process signs (none if it does not)."""
    signer = auth.installed()
    return {} if signer is None else {AUTH_HEADER: signer.header(method, url, None, None, clustermgr_api.ROUTES)}


def _leader(urls: list[str], names: list[str], verify: ssl.SSLContext | bool) -> str | None:
    """The clustermgr named by a replica's Raft status (node ids are 1, 2, ... in member order, as `names`)."""
    for url in urls:
        try:
            status = f"{url}{clustermgr_api.RAFT_STATUS.path}"
            leader = httpx.get(status, timeout=1.0, headers=_signed("GET", status), verify=verify).json().get("leader")
        except (httpx.HTTPError, ValueError):
            continue
        if leader:
            return names[int(leader) - 1]
    return None


def status(root: Path = DEFAULT_DIR) -> ClusterStatus:
    info = ClusterInfo.load(root)
    verify = info.verify
    processes = []
    for p in info.processes:
        alive = p.running
        processes.append(ProcessStatus(p.role, p.name, p.pid, p.port, p.url, alive,
                                       alive and healthy(p.url, verify=verify), p.host))

    def leader(urls: list[str]) -> str | None:
        names = {p.url: p.name for p in info.processes if p.role == "clustermgr"}
        return _leader(urls, [names[url] for url in urls], verify)

    leaders = {k: leader(urls) for k, urls in info.region.items()}
    return ClusterStatus(info.dir, info.access_url, leader(info.clustermgr_urls), processes,
                         info.dashboard_url or None, leaders, list(info.access_urls))
