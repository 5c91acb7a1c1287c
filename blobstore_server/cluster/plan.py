"""What a cluster consists of: every process with its address, port, config and command. No I/O here.

Two layouts feed one set of config builders: `plan_cluster` puts a local cluster on 127.0.0.1 (a "host" is a
port, every process gets a free one), `plan_spec` puts a cluster spec's processes on its hosts (the same ports
on every host). The launcher turns a plan into running processes and `blobstore.render` into per-host bundles;
keeping it pure lets a test or a benchmark look at (or tweak) the configs before anything starts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from blobstore_server.cluster import pki
from blobstore_server.cluster.kafka_auth import kafka_user
from blobstore_server.cluster.redis_auth import acl_config, with_credentials
from blobstore_server.cluster.spec import ClusterSpec
from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.mq.seal import message_key
from blobstore_server.libs.mq.settings import KafkaAuth
from blobstore_server.libs.proto.blobnode import S3Access
from blobstore_server.libs.proto.clustermgr import CodeModeRule
from blobstore_server.libs.rpc import tickets
from blobstore_server.libs.rpc.auth import AuthConfig
from blobstore_server.libs.rpc.config import ServiceSettings, TLSConfig
from blobstore_server.libs.rpc.routes import Capability
from blobstore_server.services.access.config import AccessConfig, ClusterHosts
from blobstore_server.services.allocator.config import AllocatorConfig
from blobstore_server.services.blobnode.config import BlobnodeConfig, DiskConfig
from blobstore_server.services.clustermgr.config import ClusterMgrConfig, Member
from blobstore_server.services.dashboard.config import DashboardConfig, Target
from blobstore_server.services.mqproxy.config import MqProxyConfig
from blobstore_server.services.s3.config import S3Config, ServiceUser
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.tinker.config import TinkerConfig
from blobstore_server.services.worker.config import WorkerConfig

HOST = "127.0.0.1"
CLUSTERMGR_COUNT = 3
KAFKA_PARTITIONS = 2  # per topic: one tinker consumes them all, and `queue stats` stays short
LOCAL_BROKEN_AFTER = 120.0  # `cluster up`'s disk_broken_after: an unattended repair within minutes
# Start order: each stage is healthy before the next one starts, because later stages register with (or, for
# tinker, consume the topics created by; for the S3 gateways, write through) earlier ones. Within a stage the
# processes import and start side by side (each Python process spends ~0.8 s of CPU importing before it serves).
STAGES: tuple[tuple[str, ...], ...] = (("redis", "kafka"), ("clustermgr",), ("blobnode",),
                                       ("allocator", "scheduler", "mqproxy"),
                                       ("worker", "tinker", "access", "dashboard"), ("s3",))


@dataclass(frozen=True)
class ClusterShape:
    blobnodes: int = 6
    disks_per_node: int = 2
    code_mode: CodeMode = CodeMode.EC3P3
    # writable volumes clustermgr keeps: each allocator leases 4, so two lease 8 of them; clustermgr keeps one more
    # unleased (CodeModeRule.min_idle_volumes) and makes another as soon as one is leased, fills up or loses a disk;
    # a restarted allocator takes back the leases it held
    min_volumes: int = 8
    chunk_size: int = 1 << 30  # one unit's capacity; chunk files are sparse, so this is a ceiling, not disk use
    delete_delay: float = 60.0  # tinker's safe delay: seconds from a DELETE to its space being reclaimed
    audit_log: bool = True  # each access node writes accessN/audit.jsonl
    # HTTPS for every HTTP service and Raft, with a certificate for 127.0.0.1 in the cluster folder (Kafka and Redis
    # stay plaintext): nothing crosses a network here, this is for measuring what TLS costs (bench/tls.py)
    tls: bool = False
    export_roots: tuple[str, ...] = ()  # besides the cluster's folder, where blobnodes may write inspection exports
    clusters: int = 1  # a region: this many clusters (ids 1..K) behind the access nodes, sharing Kafka and Redis
    # seconds of silence before a disk is repaired unattended (None: off); shorter than production's 600 s so a
    # local cluster shows it within minutes
    disk_broken_after: float | None = LOCAL_BROKEN_AFTER
    allocators: int = 2  # per cluster: allocator1..N, any of which serves any access node
    access_nodes: int = 2  # access1..N, each given every allocator of every cluster; an S3 gateway s3gwN beside each

    def __post_init__(self) -> None:
        if self.allocators < 1 or self.access_nodes < 1:
            raise ValueError(f"a cluster needs at least one allocator and one access node, not "
                             f"{self.allocators} and {self.access_nodes}")


@dataclass(frozen=True)
class Place:
    """Where one process runs: the address and port it binds, its folders, the machine facts placement
    spreads over (empty `host` on one machine, where its URL stands for the host) and its host's certificate."""

    name: str
    address: str
    port: int
    workdir: Path  # its state and its log
    config_path: Path
    host: str = ""
    rack: str = "r0"
    az: str = "z0"
    disks: tuple[str, ...] = ()  # a blobnode's
    second_port: int = 0  # a clustermgr's Raft port, a Kafka broker's controller port
    tls: TLSConfig | None = None  # its host's certificate, key and the cluster CA (none: plaintext)

    @property
    def bind(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.bind}"


@dataclass(frozen=True)
class BrokerSpec:
    """One Kafka broker of a KRaft quorum (broker and controller in one JVM), which cluster/kafka_broker.py
    starts itself with its data under `place.workdir`."""

    node_id: int
    place: Place


@dataclass(frozen=True)
class KafkaPlan:
    brokers: list[BrokerSpec]  # ours; empty when the spec names the operator's brokers
    bootstrap: str  # host:port,host:port,...
    replication_factor: int = 1
    min_insync_replicas: int = 1
    cluster_uuid: str = ""  # the KRaft cluster id every broker is formatted with; "": a fresh one
    secret: str = ""  # our brokers' SASL/SCRAM users and ACLs derive from it (cluster/kafka_auth.py); "": none

    @property
    def voters(self) -> list[tuple[int, str, int]]:
        return [(b.node_id, b.place.address, b.place.second_port) for b in self.brokers]


@dataclass(frozen=True)
class ProcessSpec:
    """One process: `command` reads `config_text` from `config_path`; it logs to `log_path`."""

    role: str
    name: str
    port: int
    url: str
    workdir: Path
    config_path: Path
    config_text: str
    command: tuple[str, ...]
    cluster_id: int = 1  # of a region's cluster; shared processes (access nodes, Kafka, Redis) say 1
    host: str = ""  # the machine it runs on, when the plan has machines

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"


@dataclass(frozen=True)
class ClusterPlan:
    kafka: KafkaPlan
    processes: list[ProcessSpec]  # in start order; Kafka's brokers are in `kafka`
    tls: dict[str, pki.HostTLS] = field(default_factory=dict)  # each host's certificates (none: plaintext)

    def clustermgr_urls(self) -> dict[int, list[str]]:
        """Each cluster's clustermgr URLs, by cluster id."""
        by_cluster: dict[int, list[str]] = {}
        for p in self.processes:
            if p.role == "clustermgr":
                by_cluster.setdefault(p.cluster_id, []).append(p.url)
        return by_cluster

    def of_role(self, role: str) -> list[ProcessSpec]:
        """Every process of `role`, in start order (access1, access2, ...)."""
        return [p for p in self.processes if p.role == role]


@dataclass(frozen=True)
class Settings:
    """What every process of a plan shares besides where it runs."""

    python: str
    auth_secret: str  # signs internal requests: each process gets its role keys
    location_secret: str  # signs Locations, the same on every access node
    code_modes: tuple[CodeMode, ...]  # the first is the default
    min_volumes: int
    delete_delay: float
    disk_broken_after: float | None
    kafka_bootstrap: str
    redis_url: str
    chunk_size: int
    partitions: int = KAFKA_PARTITIONS
    audit_log: bool = True
    export_roots: tuple[str, ...] = ()  # where blobnodes may write the inspection's exports
    kafka_sasl: bool = True  # our brokers require SASL/SCRAM logins (cluster/kafka_auth.py); an operator's need not
    # host -> the CA file its processes check our brokers' (Redis') certificate with: empty without TLS, and for an
    # operator's Kafka (Redis), which keeps what it has
    kafka_ca: dict[str, str] = field(default_factory=dict)
    redis_ca: dict[str, str] = field(default_factory=dict)
    s3_namespace: str = ""  # the gateways' shared PostgreSQL DSN; empty: the first gateway's SQLite file
    export_s3: S3Access | None = None  # the inspection's bucket on the first gateway (none: a plan without one)


# The inspection's exports and findings go to a bucket of the cluster's first gateway: the blobnodes of every host
# and a Spark driver anywhere reach it, where a folder would be one machine's
EXPORT_USER = EXPORT_BUCKET = "blobstore-inspect"
EXPORT_ROOT = f"s3://{EXPORT_BUCKET}/"

# The capabilities (libs/rpc/auth.py) each kind of process holds: what it calls and what it serves, nothing
# more; the note of issue 27 has the table. The operator's CLI derives every key from the cluster secret. A
# blobnode signs its disk reports with its own identity (its advertised host), which clustermgr checks against the
# disk's owner; blobnodes also check read-shard grants (the inspection's executors).
C = Capability
CAPABILITIES: dict[str, tuple[Capability, ...]] = {
    "clustermgr": (C.OBSERVE, C.REGISTER, C.DISK_STATUS, C.UNITS, C.KV, C.CANCEL_DELETE, C.ADMIN,
                   C.CHUNK, C.RAFT_MEMBER, C.READ_SHARD),  # read-shard: a move's destination checked (moves.py)
    "blobnode": (C.READ_SHARD, C.WRITE_SHARD, C.DELETE_SHARD, C.DISCARD_SHARD, C.CHUNK, C.EXPORT, C.OBSERVE,
                 C.QUEUE_REPAIR, C.DISK_REPORT),
    "access": (C.READ_SHARD, C.WRITE_SHARD, C.OBSERVE, C.ALLOCATE, C.QUEUE_REPAIR, C.QUEUE_DELETE, C.UNDELETE,
               C.CANCEL_DELETE),
    "allocator": (C.ALLOCATE, C.OBSERVE, C.LEASE),
    "mqproxy": (C.QUEUE_REPAIR, C.QUEUE_DELETE, C.REGISTER, C.OBSERVE),
    "scheduler": (C.OBSERVE, C.REGISTER, C.KV, C.UNITS, C.DISK_STATUS, C.TASKS, C.TASK_CONTROL, C.QUEUE_REPAIR,
                  C.READ_SHARD, C.CHUNK),
    "worker": (C.TASKS, C.READ_SHARD, C.WRITE_SHARD, C.DISCARD_SHARD, C.OBSERVE, C.REGISTER, C.REPAIR),
    "tinker": (C.OBSERVE, C.READ_SHARD, C.WRITE_SHARD, C.DELETE_SHARD, C.REPAIR),  # read-shard: a reclaim stats shards
    "dashboard": (C.OBSERVE,),
    "s3": (C.OBSERVE,),  # the gateway reaches access's public routes (PUT, GET, DELETE of a Location)
}


NAMED = frozenset({"blobnode", "allocator"})  # sign their identity-bound routes under their advertised host


# Who mints each kind of ticket (libs/rpc/tickets.py): the service deciding the destructive call it lets go
MINTS = {tickets.KINDS[kind].minter: kind for kind in tickets.KEYED}


def role_keys(secret: str, role: str, name: str | None = None) -> AuthConfig:
    """The `auth` section of a `role` process (named `name` if its role is NAMED): its capabilities' keys;
    clustermgr also the identities root it checks disk reports and leases against; a minter of tickets (MINTS) the
    private key of its kind only, a blobnode the public keys of every kind."""
    return AuthConfig.for_capabilities(secret, CAPABILITIES[role], name=name, verifies_identities=role == "clustermgr",
                                       mints=MINTS.get(role), verifies_tickets=role == "blobnode")


ROLES: dict[type[ServiceSettings], str] = {
    ClusterMgrConfig: "clustermgr", BlobnodeConfig: "blobnode", AllocatorConfig: "allocator", AccessConfig: "access",
    SchedulerConfig: "scheduler", WorkerConfig: "worker", MqProxyConfig: "mqproxy", TinkerConfig: "tinker",
    DashboardConfig: "dashboard", S3Config: "s3",
}


def _service(place: Place, settings: Settings, config: ServiceSettings, cluster_id: int = 1) -> ProcessSpec:
    """The process running `config` (the service's own config model, so a misnamed setting fails type checks and
    validation here, not at the service's start) at `place`, with its role's keys, its bind address and TLS."""
    role = ROLES[type(config)]
    name = None
    if isinstance(config, BlobnodeConfig | AllocatorConfig):  # NAMED: each signs as its advertised host
        name = config.host or place.url
    keys = role_keys(settings.auth_secret, role, name)
    bind = {} if role == "clustermgr" else {"bind_addr": place.bind}  # which binds its `members` entry
    tls = {} if place.tls is None else {"tls": place.tls}
    config = config.model_copy(update={**bind, **tls, "auth": keys})
    return ProcessSpec(role, place.name, place.port, place.url, place.workdir, place.config_path,
                       config.model_dump_json(indent=2, exclude_unset=True),
                       (settings.python, "-m", f"blobstore_server.services.{role}", "-c", str(place.config_path)),
                       cluster_id, place.host)


def _redis(place: Place, auth_secret: str, tls: TLSConfig | None = None) -> ProcessSpec:
    # A volume cache only: no persistence, so nothing is written but the log. Protected mode is off (it would
    # refuse every client of another host); the ACL requires a password instead (cluster/redis_auth.py).
    # Its URL names no password: it is shown by `cluster status`; the access nodes get `with_credentials`.
    # With `tls` its port speaks TLS only (`port 0`: no plaintext port); clients present no certificate, they log
    # in with the password, which then never crosses the network in clear.
    listen = f"port {place.port}\n" if tls is None else (
        f"port 0\ntls-port {place.port}\ntls-cert-file {tls.cert_file}\ntls-key-file {tls.key_file}\n"
        f"tls-ca-cert-file {tls.ca_file}\ntls-auth-clients no\n")
    text = (f'bind {place.address}\n{listen}protected-mode no\nsave ""\nappendonly no\n'
            f'daemonize no\ndir {place.workdir}\n{acl_config(auth_secret)}')
    scheme = "redis" if tls is None else "rediss"
    return ProcessSpec("redis", place.name, place.port, f"{scheme}://{place.bind}/0", place.workdir,
                       place.config_path, text, ("redis-server", str(place.config_path)), host=place.host)


def _cluster(layout: dict[str, list[Place]], s: Settings, cluster_id: int) -> list[ProcessSpec]:
    """The processes of one cluster: clustermgrs, blobnodes, allocators, schedulers, workers, mqproxies, tinker."""
    members = {n: Member(raft_addr=f"{p.address}:{p.second_port}", http_addr=p.bind)
               for n, p in enumerate(layout["clustermgr"], 1)}
    policy = [CodeModeRule(code_mode=mode, min_volumes=s.min_volumes) for mode in s.code_modes]
    disks = sum(len(p.disks) for p in layout["blobnode"])
    cms = [_service(p, s, ClusterMgrConfig(
               node_id=n, members=members, data_dir=str(p.workdir / "data"), code_modes=policy,
               chunk_size=s.chunk_size, volume_check_interval=0.5,
               first_volume_after_disks=disks,  # no volume before every disk planned here registered: all hosts
               disk_broken_after=s.disk_broken_after,
               disk_heartbeat_timeout=10.0), cluster_id)  # three of the blobnodes' beats (3 s apart)
           for n, p in enumerate(layout["clustermgr"], 1)]
    cm_urls = [cm.url for cm in cms]
    blobnodes = [_service(p, s, BlobnodeConfig(  # its cluster: its disks' format and the delete intents it takes
                     cluster_id=cluster_id, hostname=p.host, rack=p.rack, idc=p.az,
                     disks=[DiskConfig(path=d) for d in p.disks],
                     clustermgr_hosts=cm_urls, export_roots=list(s.export_roots), export_s3=s.export_s3,
                     delete_hold=s.delete_delay), cluster_id)  # tinker's safe delay, enforced
                 for p in layout["blobnode"]]
    tinker = layout["tinker"][0]
    sealing = message_key(s.auth_secret).hex()  # mqproxy seals repair and delete messages, tinker checks them

    def each(role: str, config: ServiceSettings) -> list[ProcessSpec]:
        return [_service(p, s, config, cluster_id) for p in layout[role]]

    return [*cms, *blobnodes,
            *each("allocator", AllocatorConfig(clustermgr_hosts=cm_urls, code_modes=list(s.code_modes))),
            *each("scheduler", SchedulerConfig(clustermgr_hosts=cm_urls)),
            *each("worker", WorkerConfig(clustermgr_hosts=cm_urls)),
            *(_service(p, s, MqProxyConfig(clustermgr_hosts=cm_urls, kafka_bootstrap=s.kafka_bootstrap,
                                           partitions=s.partitions, cluster_id=cluster_id, message_key=sealing,
                                           kafka_auth=_kafka_login(s, "mqproxy", p), insecure=not s.kafka_sasl),
                       cluster_id) for p in layout["mqproxy"]),
            *(_service(p, s, TinkerConfig(clustermgr_hosts=cm_urls, kafka_bootstrap=s.kafka_bootstrap,
                                          delete_safe_delay=s.delete_delay,
                                          delete_log=str(tinker.workdir / "deletes.jsonl"), cluster_id=cluster_id,
                                          group_prefix=f"{cluster_prefix(cluster_id)}tinker", message_key=sealing,
                                          kafka_auth=_kafka_login(s, "tinker", p), insecure=not s.kafka_sasl),
                       cluster_id) for p in layout["tinker"])]


def _kafka_login(s: Settings, user: str, place: Place) -> KafkaAuth | None:
    """Each process logs in to Kafka as its own user, whose ACLs fit its part, over TLS when its host has the CA."""
    return kafka_user(s.auth_secret, user, s.kafka_ca.get(place.host)) if s.kafka_sasl else None


def _gateways(places: list[Place], nodes: list[ProcessSpec], s: Settings) -> list[ProcessSpec]:
    """The S3 gateways: gateway i sits beside access node i (on its host, in a spec) and is given every access
    node, its own first. All share `s.s3_namespace` (a PostgreSQL DSN) or else the first one's SQLite file, and then
    must run on one machine: SQLite in WAL mode is safe for several processes there, not across hosts (a spec
    without a DSN plans one gateway, see spec.hosts_of)."""
    urls = [n.url for n in nodes]
    shared = s.s3_namespace or str(places[0].workdir / "namespace.db")
    users = [] if s.export_s3 is None else [ServiceUser(name=EXPORT_USER, access_key=s.export_s3.access_key,
                                                        secret_key=s.export_s3.secret_key, buckets=[EXPORT_BUCKET])]
    return [_service(p, s, S3Config(access_hosts=[urls[i], *urls[:i], *urls[i + 1:]], namespace=shared,
                                    service_users=users))
            for i, p in enumerate(places)]


def _front(clusters: dict[int, list[ProcessSpec]], access: list[Place], gateways: list[Place], dashboard: list[Place],
           s: Settings) -> list[ProcessSpec]:
    """The access nodes (each given every allocator of every cluster; the first cluster is their own), the S3
    gateways in front of them and the dashboard scraping everything."""
    home = next(iter(clusters))

    def urls(k: int, role: str) -> list[str]:
        return [p.url for p in clusters[k] if p.role == role]

    region = [ClusterHosts(cluster_id=k, clustermgr_hosts=urls(k, "clustermgr"), allocator_hosts=urls(k, "allocator"),
                           mqproxy_hosts=urls(k, "mqproxy")) for k in clusters if k != home]
    nodes = [_service(p, s, AccessConfig(
                 cluster_id=home, clustermgr_hosts=urls(home, "clustermgr"), allocator_hosts=urls(home, "allocator"),
                 mqproxy_hosts=urls(home, "mqproxy"), region=region, region_refresh=2.0, secret=s.location_secret,
                 redis_url=s.redis_url, redis_ca_file=s.redis_ca.get(p.host, ""), default_code_mode=s.code_modes[0],
                 delete_safe_delay=s.delete_delay,
                 orphan_log=str(p.workdir / "orphans.jsonl"), state_file=str(p.workdir / "state.sqlite"),
                 audit_log=str(p.workdir / "audit.jsonl") if s.audit_log else ""))
             for p in access]
    scraped = [*(p for k in clusters for p in clusters[k]), *nodes, *_gateways(gateways, nodes, s)]
    boards = [_service(p, s, DashboardConfig(
                  clustermgr_hosts=urls(home, "clustermgr"), kafka_bootstrap=s.kafka_bootstrap,
                  kafka_auth=_kafka_login(s, "backlog", p),
                  targets=[Target(name=t.name, role=t.role, url=t.url) for t in scraped]))
              for p in dashboard]
    return [*scraped, *boards]


def port_count(shape: ClusterShape) -> int:
    """How many ports `plan_cluster` takes from its iterator."""
    # clustermgrs (a Raft and an HTTP port each), blobnodes, allocators, two schedulers (one stands by), worker,
    # mqproxy, tinker
    per_cluster = 2 * CLUSTERMGR_COUNT + shape.blobnodes + shape.allocators + 5
    # redis, kafka (a broker and a controller port), the clusters, the access nodes and a gateway beside each,
    # dashboard
    return 1 + 2 + shape.clusters * per_cluster + 2 * shape.access_nodes + 1


def cluster_prefix(cluster_id: int) -> str:
    """Process names of cluster 1 are plain (clustermgr1, blobnode3, ...); of cluster k, `c<k>-...`."""
    return "" if cluster_id == 1 else f"c{cluster_id}-"


LOCAL_HOST = "local"  # the name in the certificate of a cluster on 127.0.0.1 with `ClusterShape.tls`


def local_tls(root: Path) -> TLSConfig:
    """Where a cluster on 127.0.0.1 with `ClusterShape.tls` keeps its certificate, key and CA: its folder."""
    return TLSConfig(cert_file=str(root / pki.CERT_FILE), key_file=str(root / pki.KEY_FILE),
                     ca_file=str(root / pki.CA_FILE))


def _local(root: Path, name: str, ports: Iterator[int], second_port: bool = False, **facts: Any) -> Place:
    port = next(ports)
    return Place(name, HOST, port, root / name, root / name / "conf.json",
                 second_port=next(ports) if second_port else 0, **facts)


def _local_layout(root: Path, shape: ClusterShape, ports: Iterator[int], cluster_id: int) -> dict[str, list[Place]]:
    name = cluster_prefix(cluster_id)
    tls = local_tls(root) if shape.tls else None

    def places(role: str, count: int, numbered: bool = True) -> list[Place]:
        return [_local(root, f"{name}{role}{n if numbered else ''}", ports, tls=tls) for n in range(1, count + 1)]

    def clustermgr(n: int) -> Place:
        raft = next(ports)  # drawn before its HTTP port
        return replace(_local(root, f"{name}clustermgr{n}", ports, tls=tls), second_port=raft)

    cms = [clustermgr(n) for n in range(1, CLUSTERMGR_COUNT + 1)]
    blobnodes = [_local(root, f"{name}blobnode{i}", ports, tls=tls,
                        disks=tuple(str(root / f"{name}blobnode{i}" / "disks" / str(d))
                                    for d in range(1, shape.disks_per_node + 1)))
                 for i in range(1, shape.blobnodes + 1)]
    return {"clustermgr": cms, "blobnode": blobnodes, "allocator": places("allocator", shape.allocators),
            "scheduler": places("scheduler", 2), "worker": places("worker", 1, False),
            "mqproxy": places("mqproxy", 1, False), "tinker": places("tinker", 1, False)}


def plan_cluster(root: Path, shape: ClusterShape, ports: Iterator[int], python: str, secret: str,
                 auth_secret: str) -> ClusterPlan:
    """Every process of a local cluster (or region) under `root`; `ports` hands out `port_count(shape)` ports.
    `secret` signs Locations, `auth_secret` internal requests (each process gets its role keys)."""
    root = root.resolve()
    redis = _redis(_local(root, "redis", ports), auth_secret)
    kafka_place = _local(root, "kafka", ports, second_port=True)
    kafka = KafkaPlan([BrokerSpec(1, kafka_place)], kafka_place.bind)
    tls = local_tls(root) if shape.tls else None
    access = [_local(root, f"access{n}", ports, tls=tls) for n in range(1, shape.access_nodes + 1)]
    gateways = [_local(root, f"s3gw{n}", ports, tls=tls) for n in range(1, shape.access_nodes + 1)]
    s = Settings(python, auth_secret, secret, (shape.code_mode,), shape.min_volumes, shape.delete_delay,
                 shape.disk_broken_after, kafka.bootstrap, with_credentials(redis.url, auth_secret), shape.chunk_size,
                 audit_log=shape.audit_log, export_roots=(str(root), EXPORT_ROOT, *shape.export_roots),
                 export_s3=export_access(auth_secret, gateways[0].url))
    clusters = {k: _cluster(_local_layout(root, shape, ports, k), s, k) for k in range(1, shape.clusters + 1)}
    dashboard = [_local(root, "dashboard", ports, tls=tls)]
    certificates = pki.host_certificates(auth_secret, [(LOCAL_HOST, HOST)]) if shape.tls else {}
    return ClusterPlan(kafka, [redis, *_front(clusters, access, gateways, dashboard, s)], certificates)


def derived(secret: str, purpose: str, size: int = 32) -> bytes:
    """A value derived from the cluster secret, so rendering a spec again gives the same one."""
    return hmac.digest(bytes.fromhex(secret), f"blobstore {purpose}".encode(), hashlib.sha256)[:size]


def export_access(secret: str, endpoint: str) -> S3Access:
    """The S3 user that blobnodes write the inspection's exports as and `inspect run` reads them as, on the gateway
    at `endpoint`: derived from the cluster secret, so the operator's CLI has it too."""
    key_id = base64.b32encode(derived(secret, "s3 export user", 15)).decode()[:18]
    return S3Access(endpoint=endpoint, access_key=f"AK{key_id}", secret_key=derived(secret, "s3 export secret").hex())


def kafka_cluster_uuid(secret: str) -> str:
    """A KRaft cluster id (base64url of 16 bytes, as Kafka's Uuid prints), the same for every broker; never one
    starting with '-', which `kafka-storage format -t` would read as an option (one secret in 64 derived one:
    Kafka's own Uuid.randomUuid draws again then, and so does this, deterministically)."""
    purpose, attempt = "kafka cluster id", 0
    while True:
        text = base64.urlsafe_b64encode(derived(secret, purpose, 16)).decode().rstrip("=")
        if not text.startswith("-"):
            return text
        attempt += 1
        purpose = f"kafka cluster id {attempt}"


def _spec_place(spec: ClusterSpec, role: str, host_name: str) -> Place:
    host = spec.host(host_name)
    second = {"clustermgr": spec.ports.clustermgr_raft, "kafka": spec.ports.kafka_controller}.get(role, 0)
    config = spec.config_dir_of(host) / (f"{role}.properties" if role == "kafka" else
                                         f"{role}.conf" if role == "redis" else f"{role}.json")
    return Place(f"{role}-{host.name}", host.address, getattr(spec.ports, role),
                 spec.data_root_of(host) / f"{role}-{host.name}", config, host.name, host.rack, host.az,
                 tuple(host.disks) if role == "blobnode" else (), second, tls_files(spec, host_name))


def tls_files(spec: ClusterSpec, host: str) -> TLSConfig | None:
    """Where a host's processes find its certificate, key and the cluster CA (in its config folder), if TLS."""
    if not spec.tls:
        return None
    folder = spec.config_dir_of(spec.host(host))
    return TLSConfig(cert_file=str(folder / pki.CERT_FILE), key_file=str(folder / pki.KEY_FILE),
                     ca_file=str(folder / pki.CA_FILE))


def plan_spec(spec: ClusterSpec, python: str, auth_secret: str) -> ClusterPlan:
    """Every process of `spec` on its hosts; keys and the Location secret derive from `auth_secret`."""
    def places(role: str) -> list[Place]:
        return [_spec_place(spec, role, h.name) for h in spec.hosts_of(role)]

    brokers = [BrokerSpec(n, p) for n, p in enumerate(places("kafka"), 1)]
    bootstrap = ",".join(b.place.bind for b in brokers) or ",".join(spec.kafka.bootstrap)
    kafka = KafkaPlan(brokers, bootstrap, spec.kafka.replication_factor, spec.kafka.min_insync_replicas,
                      kafka_cluster_uuid(auth_secret), auth_secret if brokers else "")
    redis = [_redis(p, auth_secret, tls_files(spec, p.host)) for p in places("redis")]
    ca_files = {h.name: files.ca_file for h in spec.hosts if (files := tls_files(spec, h.name)) and files.ca_file}
    s = Settings(python, auth_secret, derived(auth_secret, "location").hex(), tuple(spec.code_modes),
                 spec.volumes_per_mode, spec.delete_delay, spec.disk_broken_after, bootstrap,
                 with_credentials(redis[0].url, auth_secret) if redis else spec.redis.url, spec.chunk_size,
                 spec.kafka.partitions, export_roots=(spec.export_root, EXPORT_ROOT), kafka_sasl=bool(brokers),
                 kafka_ca=ca_files if brokers else {}, redis_ca=ca_files if redis else {},
                 s3_namespace=spec.s3_namespace,
                 export_s3=export_access(auth_secret, places("s3")[0].url) if places("s3") else None)
    roles = ("clustermgr", "blobnode", "allocator", "scheduler", "worker", "mqproxy", "tinker")
    cluster = _cluster({role: places(role) for role in roles}, s, spec.cluster_id)
    tls = pki.host_certificates(auth_secret, [(h.name, h.address) for h in spec.hosts]) if spec.tls else {}
    return ClusterPlan(kafka, [*redis, *_front({spec.cluster_id: cluster}, places("access"), places("s3"),
                                              places("dashboard"), s)], tls)


def hosts_of(processes: Sequence[ProcessSpec]) -> list[str]:
    """The machines a plan's processes run on, in first-seen order."""
    return list(dict.fromkeys(p.host for p in processes if p.host))
