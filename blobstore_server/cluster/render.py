"""A cluster spec rendered into one bundle per host: what an operator copies onto each machine.

`DIR/<host>/config/` holds every process's config (mode 0600: they hold keys; only the role keys that process
needs), `DIR/<host>/systemd/` a unit per process and `blobstore.target`, `DIR/<host>/README.md` the steps.
`bundle` is pure; `write` puts it on disk.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from blobstore_server.cluster import kafka_auth, pki
from blobstore_server.cluster import kafka_broker as broker
from blobstore_server.cluster.plan import ClusterPlan, ProcessSpec, hosts_of, tls_files
from blobstore_server.cluster.redis_auth import REDIS_USER
from blobstore_server.cluster.spec import ClusterSpec

TARGET = "blobstore.target"
REDIS_SERVER = "/usr/bin/redis-server"  # Debian's


@dataclass(frozen=True)
class BundleFile:
    path: Path  # relative to the bundle's root
    text: str
    mode: int = 0o644


def unit_name(process: ProcessSpec) -> str:
    return f"blobstore-{process.role}.service"


def kafka_properties(plan: ClusterPlan, process: ProcessSpec) -> str:
    b = next(b for b in plan.kafka.brokers if b.place.name == process.name)
    text: str = broker.server_properties(
        node_id=b.node_id, address=b.place.address, port=b.place.port, controller_port=b.place.second_port,
        voters=plan.kafka.voters, data_dir=b.place.workdir / "data",
        replication_factor=plan.kafka.replication_factor, min_insync_replicas=plan.kafka.min_insync_replicas,
        admin=(kafka_auth.ADMIN, kafka_auth.kafka_password(plan.kafka.secret, kafka_auth.ADMIN))
        if plan.kafka.secret else None, tls=plan.tls.get(b.place.host))
    return text


def _group_prefixes(plan: ClusterPlan) -> list[str]:
    return [str(json.loads(p.config_text)["group_prefix"]) for p in plan.of_role("tinker")]


def kafka_scripts(spec: ClusterSpec, plan: ClusterPlan, host: str) -> list[tuple[str, str]]:
    """(name, text) of the Kafka host's scripts, which hold passwords (mode 0600 like the configs): the storage
    format with every SCRAM user, the admin's client.properties (over TLS, trusting the host's CA file, if the
    spec has TLS) and the ACLs to create once the brokers run. They stay in the bundle's kafka/ (run from there),
    out of the config folder the services read."""
    config_dir = spec.config_dir_of(spec.host(host))
    tls = tls_files(spec, host)
    home, users = spec.kafka.home, kafka_auth.scram_users(plan.kafka.secret)
    scram = " ".join(shlex.quote(arg) for arg in broker.scram_arguments(users))
    acls = kafka_auth.acl_commands(home, plan.kafka.bootstrap, '"$(dirname "$0")/kafka-admin.properties"',
                                   _group_prefixes(plan))
    return [("kafka-format.sh", f"#!/bin/sh -e\n{home}/bin/kafka-storage.sh format -t {plan.kafka.cluster_uuid} "
                                f"-c {config_dir}/kafka.properties {scram}\n"),
            ("kafka-admin.properties", kafka_auth.client_properties(plan.kafka.secret, kafka_auth.ADMIN,
                                                                    tls.ca_file if tls else None)),
            ("kafka-acls.sh", "#!/bin/sh -e\n" + "\n".join(acls) + "\n")]


def _exec_start(spec: ClusterSpec, process: ProcessSpec) -> str:
    if process.role == "kafka":
        return f"{spec.kafka.home}/bin/kafka-server-start.sh {process.config_path}"
    if process.role == "redis":
        return f"{REDIS_SERVER} {process.config_path}"
    return shlex.join(process.command)


def _unit(spec: ClusterSpec, process: ProcessSpec) -> str:
    heap = "Environment=KAFKA_HEAP_OPTS=-Xms1g -Xmx1g\n" if process.role == "kafka" else ""
    return f"""[Unit]
Description=blobstore {process.role} ({process.name})
Wants=network-online.target
After=network-online.target
PartOf={TARGET}

[Service]
User={spec.user}
Group={spec.user}
WorkingDirectory={process.workdir}
{heap}ExecStart={_exec_start(spec, process)}
Restart=on-failure
RestartSec=5
LimitNOFILE=1048576
TimeoutStopSec=60

[Install]
WantedBy={TARGET}
"""


def _target(host: str, processes: list[ProcessSpec]) -> str:
    units = " ".join(unit_name(p) for p in processes)
    return f"""[Unit]
Description=every blobstore process on {host}
Wants=network-online.target {units}
After=network-online.target

[Install]
WantedBy=multi-user.target
"""


def _readme(spec: ClusterSpec, plan: ClusterPlan, host: str, processes: list[ProcessSpec]) -> str:
    h = spec.host(host)
    config_dir = spec.config_dir_of(h)
    folders = " ".join(str(p) for p in [config_dir, *(p.workdir for p in processes), *h.disks])
    listing = "\n".join(f"- `{p.name}`: {p.url.split('://', 1)[1]} (`{unit_name(p)}`)" for p in processes)
    kafka = [p for p in processes if p.role == "kafka"]
    format_kafka = (f"""
Kafka (once, before its first start; every broker takes the same cluster id and the SCRAM users, whose
passwords derive from the cluster secret):

    sudo -u {spec.user} sh < kafka/kafka-format.sh   # as root: the file is readable by root only

and once every broker serves, from one Kafka host, the ACLs (each service's user may do only its part):

    sh kafka/kafka-acls.sh

`kafka/` holds the Kafka users' passwords: delete it from the host once done.
""" if kafka and plan.kafka.secret else f"""
Kafka (once, before its first start; every broker takes the same cluster id):

    sudo -u {spec.user} {spec.kafka.home}/bin/kafka-storage.sh format -t {plan.kafka.cluster_uuid} \\
        -c {config_dir}/kafka.properties
""" if kafka else "")
    cacert = f"--cacert {config_dir / pki.CA_FILE} " if host in plan.tls else ""
    checks = "\n".join(f"    curl -s {cacert if p.url.startswith('https') else ''}{p.url}/health"
                        for p in processes if p.url.startswith("http"))
    checks += _tls_checks(spec, plan, host, processes)
    tls = f"""
## TLS

`config/` holds this host's certificate ({pki.CERT_FILE}, with its address and name) and key ({pki.KEY_FILE}),
and the cluster CA's certificate ({pki.CA_FILE}), their keys derived from the cluster secret (a render again
signs with the same CA key). Every HTTP service here serves https only and checks its peers against that CA;
clustermgr's Raft port, Kafka (SASL_SSL) and Redis speak TLS too. Clients need the CA: `curl --cacert`, the
CLI's `--ca` (or `BLOBSTORE_CA`), the SDK's `Client(..., ca="ca.pem")`; `deploy render` put a copy beside the
bundles.
""" if host in plan.tls else ""
    return f"""# blobstore on {host} ({h.address}, rack {h.rack}, AZ {h.az})

{listing}

## Install

Needs Python with `pip install 'blobstore[server]'` at `{spec.python}`{", Debian's redis-server" if any(
        p.role == "redis" for p in processes) else ""}{f", Kafka at {spec.kafka.home}" if kafka else ""}.
Every host's clock synchronised (chrony or systemd-timesyncd): signed requests carry a timestamp.

    useradd --system --no-create-home --shell /usr/sbin/nologin {spec.user}
    install -d -o {spec.user} -g {spec.user} -m 0700 {folders}
    install -o {spec.user} -g {spec.user} -m 0600 config/* {config_dir}/
    install -m 0644 systemd/* /etc/systemd/system/
    systemctl daemon-reload
{format_kafka}
## Start

    systemctl enable --now {TARGET}

Start the clustermgr hosts first; the other processes retry (systemd restarts them) until a clustermgr
majority answers. Keep `{spec.secret_file}` (the cluster secret) on the operator's machine only: the CLI signs
with it (`BLOBSTORE_SECRET`); no process here needs it.
{tls}
## Check

    systemctl status 'blobstore-*'
    journalctl -u 'blobstore-*' --since -10min
{checks}
"""


def _tls_checks(spec: ClusterSpec, plan: ClusterPlan, host: str, processes: list[ProcessSpec]) -> str:
    """The README's checks that this host's Kafka broker and Redis speak TLS only, trusting the cluster CA."""
    tls = tls_files(spec, host)
    if tls is None:
        return ""
    lines = []
    for p in processes:
        address = p.url.split("://", 1)[1].split("/", 1)[0]
        if p.role == "redis":
            ip, port = address.rsplit(":", 1)
            lines += ["", "Redis takes TLS only (`port 0`, `tls-port`), and the password of the access nodes' "
                          "`redis_url`:", "",
                      f"    redis-cli --tls --cacert {tls.ca_file} -h {ip} -p {port} --user {REDIS_USER} "
                      "--askpass ping"]
        if p.role == "kafka" and plan.kafka.secret:
            lines += ["", "Kafka listens SASL_SSL only, its controller listener too (the host's certificate inline in",
                          "kafka.properties); a tool logs in with kafka/kafka-admin.properties (trusting the CA), e.g.",
                          "before `kafka/` is deleted:",
                      "", f"    {spec.kafka.home}/bin/kafka-topics.sh --bootstrap-server {address} "
                          "--command-config kafka/kafka-admin.properties --list"]
    return "\n".join(["", *lines]) if lines else ""


def certificate_files(folder: Path, tls: pki.HostTLS) -> list[BundleFile]:
    """A host's certificate, its key (readable by its owner only) and the CA, in `folder`."""
    return [BundleFile(folder / pki.CA_FILE, tls.ca), BundleFile(folder / pki.CERT_FILE, tls.cert),
            BundleFile(folder / pki.KEY_FILE, tls.key, 0o600)]


def bundle(spec: ClusterSpec, plan: ClusterPlan) -> list[BundleFile]:
    """Every file of every host's bundle (paths start with the host's name), and with TLS the CA's certificate
    for the operator's CLI and SDK (ca.pem beside the bundles)."""
    files = [BundleFile(Path(pki.CA_FILE), next(iter(plan.tls.values())).ca)] if plan.tls else []
    kafka = [ProcessSpec("kafka", b.place.name, b.place.port, f"kafka://{b.place.bind}", b.place.workdir,
                         b.place.config_path, "", (), host=b.place.host) for b in plan.kafka.brokers]
    processes = [*plan.processes, *kafka]
    for host in hosts_of(processes):
        mine = [p for p in processes if p.host == host]
        root = Path(host)
        for p in mine:
            text = kafka_properties(plan, p) if p.role == "kafka" else p.config_text
            files.append(BundleFile(root / "config" / p.config_path.name, text, 0o600))
            files.append(BundleFile(root / "systemd" / unit_name(p), _unit(spec, p)))
            if p.role == "kafka" and plan.kafka.secret:
                files.extend(BundleFile(root / "kafka" / name, text, 0o600)
                             for name, text in kafka_scripts(spec, plan, host))
        if host in plan.tls:
            files.extend(certificate_files(root / "config", plan.tls[host]))
        files.append(BundleFile(root / "systemd" / TARGET, _target(host, mine)))
        files.append(BundleFile(root / "README.md", _readme(spec, plan, host, mine)))
    return files


def write(out: Path, files: list[BundleFile]) -> None:
    """Each file with its mode (a config is never readable by others, not even for an instant)."""
    for f in files:
        path = out / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f.mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(f.text)
        os.chmod(path, f.mode)
