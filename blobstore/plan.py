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

HOST = "127.0.0.1"
CLUSTERMGR_COUNT = 3
KAFKA_PARTITIONS = 2  # per topic: one tinker consumes them all, and `queue stats` stays short
# Start order: each stage is healthy before the next one starts, because later stages register with (or, for
# tinker, consume the topics created by) earlier ones.
STAGES: tuple[tuple[str, ...], ...] = (("redis", "kafka"), ("clustermgr",), ("blobnode",), ("allocator",),
                                       ("worker",), ("mqproxy",), ("tinker",), ("access",), ("dashboard",))


@dataclass(frozen=True)
class ClusterShape:
    blobnodes: int = 6
    disks_per_node: int = 2
    code_mode: str = "EC3P3"
    min_volumes: int = 8  # writable volumes clustermgr keeps: the allocator leases 4, the rest are spares
    chunk_size: int = 1 << 30  # one unit's capacity; chunk files are sparse, so this is a ceiling, not disk use
    delete_delay: float = 60.0  # tinker's safe delay: seconds from a DELETE to its space being reclaimed
    audit_log: bool = True  # access writes access/audit.jsonl


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

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"


@dataclass(frozen=True)
class ClusterPlan:
    kafka: KafkaSpec
    processes: list[ProcessSpec]  # in start order


def _service(role: str, name: str, port: int, root: Path, python: str, config: dict[str, Any]) -> ProcessSpec:
    workdir = root / name
    conf = workdir / "conf.json"
    return ProcessSpec(role, name, port, f"http://{HOST}:{port}", workdir, conf, json.dumps(config, indent=2),
                       (python, "-m", f"services.{role}", "-c", str(conf)))


def _redis(port: int, root: Path) -> ProcessSpec:
    workdir = root / "redis"
    conf = workdir / "redis.conf"
    # A volume cache only: no persistence, so nothing is written but the log.
    text = f'bind {HOST}\nport {port}\nsave ""\nappendonly no\ndaemonize no\ndir {workdir}\n'
    return ProcessSpec("redis", "redis", port, f"redis://{HOST}:{port}/0", workdir, conf, text,
                       ("redis-server", str(conf)))


def port_count(shape: ClusterShape) -> int:
    """How many ports `plan_cluster` takes from its iterator."""
    return 1 + 2 + 2 * CLUSTERMGR_COUNT + shape.blobnodes + 6  # redis, kafka, clustermgrs, blobnodes, 6 services


def plan_cluster(root: Path, shape: ClusterShape, ports: Iterator[int], python: str, secret: str) -> ClusterPlan:
    """Every process of a local cluster under `root`; `ports` hands out `port_count(shape)` free ports."""
    root = root.resolve()
    redis = _redis(next(ports), root)
    kafka = KafkaSpec(root / "kafka", next(ports), next(ports))
    members = {str(n): {"raft_addr": f"{HOST}:{next(ports)}", "http_addr": f"{HOST}:{next(ports)}"}
               for n in range(1, CLUSTERMGR_COUNT + 1)}
    policy = [{"code_mode": shape.code_mode, "min_volumes": shape.min_volumes}]
    cms = [_service("clustermgr", f"clustermgr{n}", int(m["http_addr"].rsplit(":", 1)[1]), root, python,
                    {"node_id": int(n), "members": members, "data_dir": str(root / f"clustermgr{n}" / "data"),
                     "code_modes": policy, "chunk_size": shape.chunk_size, "volume_check_interval": 0.5,
                     # no volume before every disk started here registered: each one spreads over all hosts
                     "first_volume_after_disks": shape.blobnodes * shape.disks_per_node,
                     "disk_heartbeat_timeout": 10.0})
           for n, m in members.items()]
    cm_urls = [cm.url for cm in cms]
    blobnodes = []
    for i in range(1, shape.blobnodes + 1):
        port = next(ports)
        disks = [{"path": str(root / f"blobnode{i}" / "disks" / str(d))} for d in range(1, shape.disks_per_node + 1)]
        blobnodes.append(_service("blobnode", f"blobnode{i}", port, root, python,
                                  {"bind_addr": f"{HOST}:{port}", "disks": disks, "clustermgr_hosts": cm_urls,
                                   "heartbeat_interval": 1.0}))

    def service(role: str, **config: Any) -> ProcessSpec:
        port = next(ports)
        return _service(role, role, port, root, python, {"bind_addr": f"{HOST}:{port}", "clustermgr_hosts": cm_urls,
                                                         **config})

    allocator = service("allocator", code_modes=[shape.code_mode])
    worker = service("worker")
    mqproxy = service("mqproxy", kafka_bootstrap=kafka.bootstrap, partitions=KAFKA_PARTITIONS)
    tinker = service("tinker", kafka_bootstrap=kafka.bootstrap, delete_safe_delay=shape.delete_delay,
                     delete_log=str(root / "tinker" / "deletes.jsonl"))
    access = service("access", secret=secret, allocator_hosts=[allocator.url], mqproxy_hosts=[mqproxy.url],
                     redis_url=redis.url, default_code_mode=shape.code_mode,
                     orphan_log=str(root / "access" / "orphans.jsonl"),
                     audit_log=str(root / "access" / "audit.jsonl") if shape.audit_log else "")
    scraped = [*cms, *blobnodes, allocator, worker, mqproxy, tinker, access]
    dashboard = service("dashboard", kafka_bootstrap=kafka.bootstrap,
                        targets=[{"name": p.name, "role": p.role, "url": p.url} for p in scraped])
    return ClusterPlan(kafka, [redis, *scraped, dashboard])
