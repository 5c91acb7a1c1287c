"""A cluster spec: one TOML file that says everything a deployment on several machines needs.

`load` validates it (pydantic, unknown keys refused) and `ClusterSpec` checks the rules a deployment breaks
silently otherwise: two processes on one address:port, an even number of clustermgr replicas, fewer storage
hosts than a code mode needs to put no two units on one host, a service on a host nobody declared.
`deploy/cluster.example.toml` shows every key. Pure: reading the file is the only I/O.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from blobstore_server.libs.ec import CodeMode, CodeModeName, tactic
from blobstore_server.libs.proto.scheduler import DEFAULT_BROKEN_AFTER

HOST_NAME = r"^[a-z][a-z0-9-]{0,30}$"  # also a folder and part of a systemd unit's name
ROLES = ("clustermgr", "blobnode", "access", "allocator", "scheduler", "worker", "mqproxy", "tinker", "dashboard",
         "kafka", "redis", "s3")
DERIVED = ("blobnode", "s3")  # roles whose hosts follow from the rest of the spec, not from `services`


class SpecError(ValueError):
    """The spec is unreadable or breaks a rule; the message names the key or host at fault."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ports(Strict):
    """The port each role listens on, the same on every host (as MinIO and CubeFS deployments do)."""

    clustermgr: int = Field(9998, ge=1, le=65535)
    clustermgr_raft: int = Field(9997, ge=1, le=65535)
    blobnode: int = Field(8889, ge=1, le=65535)
    access: int = Field(9500, ge=1, le=65535)
    allocator: int = Field(9100, ge=1, le=65535)
    scheduler: int = Field(9800, ge=1, le=65535)
    worker: int = Field(9300, ge=1, le=65535)
    mqproxy: int = Field(9600, ge=1, le=65535)
    tinker: int = Field(9700, ge=1, le=65535)
    dashboard: int = Field(9900, ge=1, le=65535)
    s3: int = Field(9400, ge=1, le=65535)  # the S3 gateway's (not 9800, the scheduler's)
    kafka: int = Field(9092, ge=1, le=65535)
    kafka_controller: int = Field(9093, ge=1, le=65535)
    redis: int = Field(6379, ge=1, le=65535)


class Host(Strict):
    name: str = Field(pattern=HOST_NAME)
    address: str  # what every process on it binds and is reached at
    rack: str = "r0"
    az: str = "z0"
    disks: list[str] = Field(default_factory=list)  # a host with disks runs a blobnode
    config_dir: str = ""  # "": the spec's
    data_root: str = ""  # "": the spec's


class Services(Strict):
    """Which hosts run each role, by host name (blobnodes: every host with disks; the S3 gateway: the first access
    host)."""

    clustermgr: list[str] = Field(min_length=1)
    access: list[str] = Field(min_length=1)
    allocator: list[str] = Field(min_length=1)
    scheduler: list[str] = Field(min_length=1)  # two: one leads, the other stands by
    worker: list[str] = Field(min_length=1)
    mqproxy: list[str] = Field(min_length=1)
    tinker: list[str] = Field(min_length=1, max_length=1)
    dashboard: list[str] = Field(default_factory=list, max_length=1)
    kafka: list[str] = Field(default_factory=list)  # our brokers; empty when kafka.bootstrap names the operator's
    redis: list[str] = Field(default_factory=list, max_length=1)  # ours; empty when redis.url names the operator's


class Kafka(Strict):
    bootstrap: list[str] = Field(default_factory=list)  # host:port of the operator's brokers; empty: ours
    replication_factor: int = Field(1, ge=1)
    min_insync_replicas: int = Field(1, ge=1)
    partitions: int = Field(2, ge=1)  # per topic
    home: str = "/opt/kafka"  # where the Kafka distribution our brokers' units run is installed

    @model_validator(mode="after")
    def _isr_fits(self) -> Kafka:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(f"kafka.min_insync_replicas {self.min_insync_replicas} exceeds replication_factor "
                             f"{self.replication_factor}: no write could ever be acknowledged")
        return self


class Redis(Strict):
    url: str = ""  # the operator's (redis://host:port/db); empty: ours on services.redis


class ClusterSpec(Strict):
    cluster_id: int = Field(1, ge=1, lt=2**32)
    code_modes: list[CodeModeName] = Field(default_factory=lambda: [CodeMode.EC3P3], min_length=1)  # first: default
    volumes_per_mode: int = Field(8, ge=1)  # writable volumes clustermgr keeps per code mode
    chunk_size: int = Field(16 << 30, ge=1 << 20)  # one unit's capacity (chunk files are sparse: a ceiling)
    delete_delay: float = Field(4 * 3600.0, ge=0)  # seconds from a DELETE to its space coming back
    disk_broken_after: float | None = Field(DEFAULT_BROKEN_AFTER, gt=0)  # silence before an unattended repair
    secret_file: str = "/etc/blobstore/cluster.secret"  # every key derives from it; `render` reads it there
    config_dir: str = "/etc/blobstore"
    data_root: str = "/var/lib/blobstore"
    export_root: str = "/var/lib/blobstore/inspect"  # blobnodes write inspection exports only under it (path or URI)
    # The S3 gateways' shared namespace, a postgresql:// DSN (the operator's server): a gateway on every access host.
    # Empty: one gateway, on the first access host, with its namespace in a SQLite file of its own.
    s3_namespace: str = Field("", pattern=r"^(postgres(ql)?://.*)?$")
    # TLS on every link between hosts (HTTP, Raft, Kafka, Redis), certificates from a CA derived from the cluster
    # secret (cluster/pki.py); false only where something else encrypts the network
    tls: bool = True
    python: str = "/opt/blobstore/bin/python"  # the interpreter the blobstore package is installed for
    user: str = "blobstore"  # the dedicated user every process runs as
    ports: Ports = Field(default_factory=Ports)
    kafka: Kafka = Field(default_factory=Kafka)
    redis: Redis = Field(default_factory=Redis)
    services: Services
    hosts: list[Host] = Field(min_length=1)

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def hosts_of(self, role: str) -> list[Host]:
        """The hosts running `role`, in the order the spec lists them."""
        if role == "blobnode":
            return [h for h in self.hosts if h.disks]
        if role == "s3":
            # Without a shared namespace, one gateway: a SQLite file is one machine's, not several hosts'
            return self.hosts_of("access")[:None if self.s3_namespace else 1]
        return [self.host(name) for name in getattr(self.services, role)]

    def config_dir_of(self, host: Host) -> Path:
        return Path(host.config_dir or self.config_dir)

    def data_root_of(self, host: Host) -> Path:
        return Path(host.data_root or self.data_root)

    def listeners(self) -> Iterator[tuple[str, str, int]]:
        """(process, address, port) of every listening socket."""
        for role in ROLES:
            for host in self.hosts_of(role):
                name = f"{role}-{host.name}"
                yield name, host.address, getattr(self.ports, role)
                if role in ("clustermgr", "kafka"):
                    yield f"{name} ({'raft' if role == 'clustermgr' else 'controller'})", host.address, getattr(
                        self.ports, f"{role}_raft" if role == "clustermgr" else "kafka_controller")

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        names = Counter(h.name for h in self.hosts)
        if twice := sorted(n for n, k in names.items() if k > 1):
            raise ValueError(f"host name(s) declared twice: {', '.join(twice)}")
        for role in ROLES:
            if role in DERIVED:
                continue
            listed = getattr(self.services, role)
            if unknown := [n for n in listed if n not in names]:
                raise ValueError(f"services.{role} names undeclared host(s): {', '.join(unknown)}")
            if twice := sorted(n for n, k in Counter(listed).items() if k > 1):
                raise ValueError(f"services.{role} names host(s) twice: {', '.join(twice)}")
        self._check_addresses()
        seen: dict[tuple[str, int], str] = {}
        for name, address, port in self.listeners():
            if (address, port) in seen:
                raise ValueError(f"{name} and {seen[address, port]} both listen on {address}:{port}")
            seen[address, port] = name
        if len(self.services.clustermgr) % 2 == 0:
            raise ValueError(f"services.clustermgr has {len(self.services.clustermgr)} hosts: Raft needs an odd "
                             f"number (3 or 5), or a majority is lost with half of them")
        self._check_code_modes()
        self._check_kafka_and_redis()
        return self

    def _check_addresses(self) -> None:
        for h in self.hosts:
            try:
                address = ipaddress.ip_address(h.address)
            except ValueError:
                raise ValueError(f"host {h.name}: address {h.address!r} is not an IP address") from None
            if address.is_loopback and len(self.hosts) > 1:
                raise ValueError(f"host {h.name}: loopback address {h.address} cannot be reached from other hosts")

    def _check_code_modes(self) -> None:
        storage = self.hosts_of("blobnode")
        for mode in self.code_modes:
            t = tactic(mode)
            per_az = Counter(h.az for h in storage).most_common(t.az_count)
            need = -(-t.total // t.az_count)  # units per AZ, rounded up
            if len(per_az) < t.az_count or per_az[-1][1] < need:
                spread = f" ({need} in each of {t.az_count} AZs)" if t.az_count > 1 else ""
                raise ValueError(f"code mode {mode.name} puts its {t.total} units on distinct hosts{spread}, but only "
                                 f"{len(storage)} host(s) have disks ({', '.join(f'{az}: {k}' for az, k in per_az)})")

    def _check_kafka_and_redis(self) -> None:
        brokers = len(self.services.kafka)
        if bool(brokers) == bool(self.kafka.bootstrap):
            raise ValueError("name either our brokers' hosts (services.kafka) or the operator's brokers "
                             "(kafka.bootstrap), exactly one of them")
        if brokers and self.kafka.replication_factor > brokers:
            raise ValueError(f"kafka.replication_factor {self.kafka.replication_factor} needs as many brokers; "
                             f"services.kafka has {brokers}")
        if brokers and brokers % 2 == 0:
            raise ValueError(f"services.kafka has {brokers} hosts: its KRaft controllers need an odd number")
        if bool(self.services.redis) == bool(self.redis.url):
            raise ValueError("name either our Redis host (services.redis) or the operator's Redis (redis.url), "
                             "exactly one of them")


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"])
    message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def validate(raw: dict[str, Any], source: str = "spec") -> ClusterSpec:
    try:
        return ClusterSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{source}: {'; '.join(_problem(e) for e in exc.errors())}") from None


def parse(text: str, source: str = "spec") -> ClusterSpec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not TOML: {exc}") from None
    return validate(raw, source)


def load(path: Path) -> ClusterSpec:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    return parse(text, str(path))


def for_hosts(hosts: Sequence[tuple[str, str]], racks: int, root: Path, *, disks_per_host: int = 2,
              **settings: Any) -> ClusterSpec:
    """A spec for `(name, address)` hosts on one machine (`cluster up --hosts`): each host's configs, state and
    disks in its own folder under `root`, racks taken in turn, and the services spread so that no host runs
    more than a few: clustermgr on the first three, Kafka's brokers (three when there are three hosts) on the
    last ones, tinker and Redis away from both where there is room. From seven hosts on, the hosts after the sixth
    run the access nodes and nothing else but their blobnodes, so a partition can cut access alone off from the
    rest, and Kafka's hosts run no client of Kafka.
    `settings` are top-level keys."""
    names = [name for name, _ in hosts]
    count = len(names)

    def on(*positions: int) -> list[str]:
        """Hosts at these 1-based positions (negative: from the end), each once, within what exists."""
        picked = [names[(p - 1) % count if p > 0 else p % count] for p in positions]
        return list(dict.fromkeys(picked))

    brokers = 3 if count >= 3 else 1
    alone = count >= 7  # access on hosts of its own
    kafka = on(4, 5, 6) if alone else on(*range(-brokers, 0))
    raw: dict[str, Any] = {
        **settings,
        "secret_file": str(root / "cluster.secret"),
        "kafka": {"replication_factor": brokers, "min_insync_replicas": 2 if brokers == 3 else 1},
        "services": {"clustermgr": on(1, 2, 3) if count >= 3 else on(1), "kafka": kafka,
                     "redis": on(4), "allocator": on(1, 2), "access": on(*range(7, count + 1)) if alone else on(1, 2),
                     "scheduler": on(2, 3), "worker": on(3), "mqproxy": on(3),
                     "tinker": on(1) if alone else on(4), "dashboard": on(1)},
        "hosts": [{"name": name, "address": address, "rack": f"r{i % racks + 1}",
                   "config_dir": str(root / name / "config"), "data_root": str(root / name / "data"),
                   "disks": [str(root / name / "disks" / str(d)) for d in range(1, disks_per_host + 1)]}
                  for i, (name, address) in enumerate(hosts)],
    }
    return validate(raw, f"--hosts {count}")
