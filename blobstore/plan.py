"""What a local cluster consists of: every process with its port, config and command. No I/O here.

The launcher turns this plan into running processes; keeping it pure lets a test or a benchmark look
at (or tweak) the configs before anything starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.rpc.auth import AuthConfig, Role

HOST = "127.0.0.1"
CLUSTERMGR_COUNT = 3
KAFKA_PARTITIONS = 2  # per topic: one tinker consumes them all, and `queue stats` stays short
# Start order: each stage is healthy before the next one starts, because later stages register with (or, for
# tinker, consume the topics created by) earlier ones.
STAGES: tuple[tuple[str, ...], ...] = (("redis", "kafka"), ("clustermgr",), ("blobnode",), ("allocator",),
                                       ("scheduler",), ("worker",), ("mqproxy",), ("tinker",), ("access",),
                                       ("dashboard",))


@dataclass(frozen=True)
class ClusterShape:
    blobnodes: int = 6
    disks_per_node: int = 2
    code_mode: str = "EC3P3"
    # writable volumes clustermgr keeps: each allocator leases 4, so two lease all 8 of them and clustermgr makes
    # another as soon as one fills up or loses a disk; a restarted allocator takes back the leases it held
    min_volumes: int = 8
    chunk_size: int = 1 << 30  # one unit's capacity; chunk files are sparse, so this is a ceiling, not disk use
    delete_delay: float = 60.0  # tinker's safe delay: seconds from a DELETE to its space being reclaimed
    audit_log: bool = True  # each access node writes accessN/audit.jsonl
    clusters: int = 1  # a region: this many clusters (ids 1..K) behind the access nodes, sharing Kafka and Redis
    disk_broken_after: float | None = None  # seconds of silence before a disk is repaired unattended; None: off
    allocators: int = 2  # per cluster: allocator1..N, any of which serves any access node
    access_nodes: int = 2  # access1..N, each given every allocator of every cluster

    def __post_init__(self) -> None:
        if self.allocators < 1 or self.access_nodes < 1:
            raise ValueError(f"a cluster needs at least one allocator and one access node, not "
                             f"{self.allocators} and {self.access_nodes}")


@dataclass(frozen=True)
class KafkaSpec:
    """The broker, which deploy/kafka/broker.py starts itself (a detached JVM) with its data under `workdir`."""

    workdir: Path
    port: int
    controller_port: int

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


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

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"


@dataclass(frozen=True)
class ClusterPlan:
    kafka: KafkaSpec
    processes: list[ProcessSpec]  # in start order

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


# The role keys each kind of process signs and checks requests with (libs/rpc/auth.py). Besides clustermgr,
# only the scheduler holds the admin key: it sets disk statuses as an operator would (the operator's CLI
# derives every key from the cluster secret). Blobnodes check read grants (the inspection's executors).
ROLE_KEYS: dict[str, tuple[Role, ...]] = {
    "clustermgr": (Role.DATA, Role.CONTROL, Role.ADMIN), "blobnode": (Role.READ, Role.DATA, Role.CONTROL),
    "access": (Role.DATA, Role.CONTROL), "worker": (Role.DATA, Role.CONTROL), "tinker": (Role.DATA, Role.CONTROL),
    "scheduler": (Role.DATA, Role.CONTROL, Role.ADMIN), "allocator": (Role.CONTROL,), "mqproxy": (Role.CONTROL,),
    "dashboard": (Role.CONTROL,),
}


def _service(role: str, name: str, port: int, root: Path, python: str, config: dict[str, Any], auth_secret: str,
             cluster_id: int = 1) -> ProcessSpec:
    workdir = root / name
    conf = workdir / "conf.json"
    keys = AuthConfig.for_roles(auth_secret, ROLE_KEYS[role]).model_dump(mode="json")
    return ProcessSpec(role, name, port, f"http://{HOST}:{port}", workdir, conf,
                       json.dumps({**config, "auth": keys}, indent=2),
                       (python, "-m", f"services.{role}", "-c", str(conf)), cluster_id)


def _redis(port: int, root: Path) -> ProcessSpec:
    workdir = root / "redis"
    conf = workdir / "redis.conf"
    # A volume cache only: no persistence, so nothing is written but the log.
    text = f'bind {HOST}\nport {port}\nsave ""\nappendonly no\ndaemonize no\ndir {workdir}\n'
    return ProcessSpec("redis", "redis", port, f"redis://{HOST}:{port}/0", workdir, conf, text,
                       ("redis-server", str(conf)))


def port_count(shape: ClusterShape) -> int:
    """How many ports `plan_cluster` takes from its iterator."""
    # clustermgrs (a Raft and an HTTP port each), blobnodes, allocators, two schedulers (one stands by), worker,
    # mqproxy, tinker
    per_cluster = 2 * CLUSTERMGR_COUNT + shape.blobnodes + shape.allocators + 5
    # redis, kafka (a broker and a controller port), the clusters, the access nodes, dashboard
    return 1 + 2 + shape.clusters * per_cluster + shape.access_nodes + 1


def cluster_prefix(cluster_id: int) -> str:
    """Process names of cluster 1 are plain (clustermgr1, blobnode3, ...); of cluster k, `c<k>-...`."""
    return "" if cluster_id == 1 else f"c{cluster_id}-"


def _plan_one(root: Path, shape: ClusterShape, ports: Iterator[int], python: str, kafka: KafkaSpec,
              cluster_id: int, auth_secret: str) -> list[ProcessSpec]:
    """The processes of one cluster: clustermgrs, blobnodes, allocators, schedulers, worker, mqproxy, tinker."""
    name = cluster_prefix(cluster_id)
    members = {str(n): {"raft_addr": f"{HOST}:{next(ports)}", "http_addr": f"{HOST}:{next(ports)}"}
               for n in range(1, CLUSTERMGR_COUNT + 1)}
    policy = [{"code_mode": shape.code_mode, "min_volumes": shape.min_volumes}]
    cms = [_service("clustermgr", f"{name}clustermgr{n}", int(m["http_addr"].rsplit(":", 1)[1]), root, python,
                    {"node_id": int(n), "members": members, "data_dir": str(root / f"{name}clustermgr{n}" / "data"),
                     "code_modes": policy, "chunk_size": shape.chunk_size, "volume_check_interval": 0.5,
                     # no volume before every disk started here registered: each one spreads over all hosts
                     "first_volume_after_disks": shape.blobnodes * shape.disks_per_node,
                     "disk_heartbeat_timeout": 10.0, "disk_broken_after": shape.disk_broken_after}, auth_secret,
                    cluster_id)
           for n, m in members.items()]
    cm_urls = [cm.url for cm in cms]
    blobnodes = []
    for i in range(1, shape.blobnodes + 1):
        port = next(ports)
        disks = [{"path": str(root / f"{name}blobnode{i}" / "disks" / str(d))}
                 for d in range(1, shape.disks_per_node + 1)]
        blobnodes.append(_service("blobnode", f"{name}blobnode{i}", port, root, python,
                                  {"bind_addr": f"{HOST}:{port}", "disks": disks, "clustermgr_hosts": cm_urls,
                                   "heartbeat_interval": 1.0}, auth_secret, cluster_id))

    def service(role: str, instance: str = "", **config: Any) -> ProcessSpec:
        port = next(ports)
        return _service(role, f"{name}{role}{instance}", port, root, python,
                        {"bind_addr": f"{HOST}:{port}", "clustermgr_hosts": cm_urls, **config}, auth_secret,
                        cluster_id)

    allocators = [service("allocator", str(n), code_modes=[shape.code_mode]) for n in range(1, shape.allocators + 1)]
    schedulers = [service("scheduler", str(n)) for n in (1, 2)]
    worker = service("worker")
    mqproxy = service("mqproxy", kafka_bootstrap=kafka.bootstrap, partitions=KAFKA_PARTITIONS, cluster_id=cluster_id)
    tinker = service("tinker", kafka_bootstrap=kafka.bootstrap, delete_safe_delay=shape.delete_delay,
                     delete_log=str(root / f"{name}tinker" / "deletes.jsonl"), cluster_id=cluster_id,
                     group_prefix=f"{name}tinker")
    return [*cms, *blobnodes, *allocators, *schedulers, worker, mqproxy, tinker]


def plan_cluster(root: Path, shape: ClusterShape, ports: Iterator[int], python: str, secret: str,
                 auth_secret: str) -> ClusterPlan:
    """Every process of a local cluster (or region) under `root`; `ports` hands out `port_count(shape)` ports.
    `secret` signs Locations, `auth_secret` internal requests (each process gets its role keys)."""
    root = root.resolve()
    redis = _redis(next(ports), root)
    kafka = KafkaSpec(root / "kafka", next(ports), next(ports))
    clusters = {k: _plan_one(root, shape, ports, python, kafka, k, auth_secret) for k in range(1, shape.clusters + 1)}

    def urls(k: int, role: str) -> list[str]:
        return [p.url for p in clusters[k] if p.role == role]

    region = [{"cluster_id": k, "clustermgr_hosts": urls(k, "clustermgr"), "allocator_hosts": urls(k, "allocator"),
               "mqproxy_hosts": urls(k, "mqproxy")} for k in clusters if k != 1]

    def access(name: str) -> ProcessSpec:
        """One access node: all of them alike (same secret, every allocator), but for port and log folder."""
        port = next(ports)
        return _service("access", name, port, root, python,
                        {"bind_addr": f"{HOST}:{port}", "cluster_id": 1, "clustermgr_hosts": urls(1, "clustermgr"),
                         "allocator_hosts": urls(1, "allocator"), "mqproxy_hosts": urls(1, "mqproxy"),
                         "region": region, "region_refresh": 2.0,
                         "secret": secret, "redis_url": redis.url, "default_code_mode": shape.code_mode,
                         "orphan_log": str(root / name / "orphans.jsonl"),
                         "audit_log": str(root / name / "audit.jsonl") if shape.audit_log else ""}, auth_secret)

    access_nodes = [access(f"access{n}") for n in range(1, shape.access_nodes + 1)]
    scraped = [*(p for k in clusters for p in clusters[k]), *access_nodes]
    port = next(ports)
    dashboard = _service("dashboard", "dashboard", port, root, python,
                         {"bind_addr": f"{HOST}:{port}", "clustermgr_hosts": urls(1, "clustermgr"),
                          "kafka_bootstrap": kafka.bootstrap,
                          "targets": [{"name": p.name, "role": p.role, "url": p.url} for p in scraped]}, auth_secret)
    return ClusterPlan(kafka, [redis, *scraped, dashboard])
