"""Fetch, start and stop a Kafka broker (KRaft, broker+controller in one JVM): the one local broker on 127.0.0.1,
or one member of a static three-node quorum on any address, possibly inside a network namespace.

The jars come from Maven Central through `kafka-pom.xml` beside this file (installed with the package) and are
cached in ~/.cache/blobstore: `make setup` or the first `cluster up` fetches them once (`fetch`). A broker runs
detached and is stopped by the PID in `DIR/kafka.pid`, never by name. A quorum member cannot serve before a
majority of its voters runs: start every member with `--no-wait`
(all formatted with one cluster id), then `wait` for the cluster.

    python -m blobstore_server.cluster.kafka_broker fetch
    python -m blobstore_server.cluster.kafka_broker start --dir DIR [--port P] [--controller-port C]
    python -m blobstore_server.cluster.kafka_broker stop --dir DIR

    id=$(python -m blobstore_server.cluster.kafka_broker uuid)
    python -m blobstore_server.cluster.kafka_broker start --dir DIR1 --address 10.0.0.1 --node-id 1 \\
        --voters 1@10.0.0.1:9093,2@10.0.0.2:9093,3@10.0.0.3:9093 --cluster-uuid $id --replication-factor 3 \\
        --min-insync-replicas 2 [--netns NS] --no-wait          # and likewise nodes 2 and 3
    python -m blobstore_server.cluster.kafka_broker wait --bootstrap 10.0.0.1:9092,10.0.0.2:9092,10.0.0.3:9092
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from blobstore_server.cluster.pki import HostTLS
from blobstore_server.libs.maven import cache_root, fetch_jars

HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-pom.xml"
# C1 only and a small serial heap: the JVM starts ~1 s faster on 2 cores; plenty for tests and the demo.
JVM_OPTS = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]
EXEC_TIMEOUT = 10.0  # for a `wrap` command (`ip netns exec NS`) to become the JVM

Voter = tuple[int, str, int]  # (node id, host, controller port): one entry of controller.quorum.voters

LOG4J2 = """\
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
"""

SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://{address}:{port},CONTROLLER://{address}:{cport}
advertised.listeners=PLAINTEXT://{address}:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor={rf}
min.insync.replicas={isr}
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
group.initial.rebalance.delay.ms=0
# A broker killed and started again cannot register until the session of its old self has expired: 4.5 s rather
# than the default 9 s brings it back in ~6 s rather than ~12 s, and fences a dead one sooner.
broker.session.timeout.ms=4500
broker.heartbeat.interval.ms=1500
"""

# With users: clients and brokers log in with SASL/SCRAM-SHA-512 on the client listener, whose credentials live
# in the metadata log (bootstrapped by `format --add-scram`). The controller listener cannot use SCRAM in KRaft
# (a controller must authenticate before it has read any metadata; still so in Kafka 4.1, KAFKA-15513), so it takes
# PLAIN with the admin's password from this file: over TLS (`tls`) that password never crosses the network in
# clear. The StandardAuthorizer lets only the admin (super user) do what no ACL allows. {protocol} is
# SASL_PLAINTEXT, or SASL_SSL with TLS_PROPERTIES.
SASL_PROPERTIES = """\
listeners={protocol}://{address}:{port},CONTROLLER://{address}:{cport}
advertised.listeners={protocol}://{address}:{port}
listener.security.protocol.map={protocol}:{protocol},CONTROLLER:{protocol}
inter.broker.listener.name={protocol}
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
sasl.mechanism.controller.protocol=PLAIN
listener.name.{listener}.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.{listener}.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \\
    required username="{admin}" password="{password}";
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\
    required username="{admin}" password="{password}" user_{admin}="{password}";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:{admin}
allow.everyone.if.no.acl.found=false
"""

# Every listener (and the broker's and controller's own connections to the others, which check the peer's
# certificate against the CA and its address) with the host's certificate. The PEM text is inline: Kafka's PEM
# keystore file must hold the key and its chain in one file, where a host has them in two; inline, an unencrypted
# PKCS#8 key needs no `ssl.key.password`. Clients present no certificate: they log in with SCRAM.
TLS_PROPERTIES = """\
ssl.keystore.type=PEM
ssl.keystore.key={key}
ssl.keystore.certificate.chain={cert}
ssl.truststore.type=PEM
ssl.truststore.certificates={ca}
ssl.client.auth=none
"""


def _inline(pem: str) -> str:
    """PEM text as one property value: its lines joined by the properties format's continuation (`\\`)."""
    return " \\\n    ".join(pem.strip().splitlines())


def kafka_version() -> str:
    """The broker version, declared once in kafka-pom.xml."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise RuntimeError(f"no <kafka.version> in {POM}")
    return match.group(1)


def jar_dir() -> Path:
    return cache_root() / f"kafka-{kafka_version()}" / "libs"


def fetch() -> Path:
    """Copy the broker jars into the cache once; later calls return at once."""
    return fetch_jars(POM, jar_dir(), "kafka_2.13-*.jar")


def random_cluster_uuid() -> str:
    """A fresh cluster id as Kafka's Uuid.randomUuid makes it (URL-safe base64 of 16 bytes, unpadded, never
    starting with '-'), without the ~1 s JVM start of `StorageTool random-uuid`."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(*, node_id: int, address: str, port: int, controller_port: int, voters: Sequence[Voter],
                      data_dir: Path | str, replication_factor: int = 1, min_insync_replicas: int = 1,
                      admin: tuple[str, str] | None = None, tls: HostTLS | None = None) -> str:
    """The server.properties of one broker+controller node; pure, so a renderer for other machines can use it.

    Every topic (internal ones too) gets `replication_factor` replicas, and an acks=all write needs
    `min_insync_replicas` of them. Every node is a broker, so the factor cannot exceed the voters. Kafka 4.1
    copies min.insync.replicas into its metadata log as the cluster-wide default when the quorum first starts,
    so a later change here is shadowed (change it with kafka-configs instead).

    With `admin` (user, password) every listener requires SASL (SASL_PROPERTIES); without, all is PLAINTEXT.
    With `tls` too (the host's certificate, key and the cluster CA) every listener is SASL_SSL.
    """
    if tls is not None and admin is None:
        raise ValueError("TLS on Kafka comes with logins (admin): a SSL listener without SASL is not planned")
    if node_id not in {voter[0] for voter in voters}:
        raise ValueError(f"node {node_id} is not among the voters {voters}: every node is a controller")
    if not 1 <= min_insync_replicas <= replication_factor <= len(voters):
        raise ValueError(f"need 1 <= min_insync_replicas ({min_insync_replicas}) <= replication_factor "
                         f"({replication_factor}) <= brokers ({len(voters)})")
    text = SERVER_PROPERTIES.format(node_id=node_id, voters=",".join(f"{n}@{h}:{p}" for n, h, p in voters),
                                    address=address, port=port, cport=controller_port, data=data_dir,
                                    rf=replication_factor, isr=min_insync_replicas)
    if admin is None:
        return text
    if not all(re.fullmatch(r"[A-Za-z0-9_.-]+", part) for part in admin):
        raise ValueError("the Kafka admin's name and password must be plain [A-Za-z0-9_.-] (they go in JAAS)")
    kept = [line for line in text.splitlines(keepends=True)
            if not line.startswith(("listeners=", "advertised.listeners=", "listener.security.protocol.map=",
                                    "inter.broker.listener.name="))]
    protocol = "SASL_PLAINTEXT" if tls is None else "SASL_SSL"
    text = "".join(kept) + SASL_PROPERTIES.format(protocol=protocol, listener=protocol.lower(), address=address,
                                                  port=port, cport=controller_port, admin=admin[0], password=admin[1])
    if tls is None:
        return text
    return text + TLS_PROPERTIES.format(key=_inline(tls.key), cert=_inline(tls.cert), ca=_inline(tls.ca))


def scram_arguments(users: Mapping[str, str]) -> list[str]:
    """`kafka-storage format` arguments that store each user's SCRAM-SHA-512 credential in the metadata log."""
    return [arg for user, password in users.items()
            for arg in ("--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]")]


def _java(libs: Path, log4j2: Path, main: str, *args: str) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java (OpenJDK 17+) is needed to run Kafka: apt-get install openjdk-17-jre-headless")
    return [java, *JVM_OPTS, f"-Dlog4j2.configurationFile={log4j2}", "-cp", f"{libs}/*", main, *args]


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return host, int(port)


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _serving_brokers(bootstrap: str, client: Mapping[str, Any]) -> int:
    """How many brokers the cluster lists as serving; 0 while it does not answer. A broker that registered but
    has not caught up with the metadata log is fenced: it is not listed and gets no replicas yet."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        return len(AdminClient({"bootstrap.servers": bootstrap, **client}).list_topics(timeout=3).brokers)
    except KafkaException:
        return 0


def _alive(pid: int) -> bool:
    """True while `pid` runs; reaps it when it is our own exited child, so a zombie counts as gone."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _is_our_broker(pid: int, directory: Path) -> bool:
    """Guards against a recycled PID: only a kafka.Kafka JVM started on this DIR is ever signalled."""
    cmdline = _cmdline(pid)
    return "kafka.Kafka" in cmdline and str(directory / "server.properties") in cmdline


def _running(directory: Path) -> bool:
    pid_file = directory / "kafka.pid"
    return pid_file.exists() and _alive(int(pid_file.read_text()))


def _tails(directories: Sequence[Path]) -> str:
    return "".join((d / name).read_text(errors="replace")[-2000:]
                   for d in directories for name in ("kafka.out", "kafka.log") if (d / name).exists())


def _format(libs: Path, log4j2: Path, props: Path, data: Path, cluster_uuid: str | None,
            wrap: Sequence[str], users: Mapping[str, str]) -> None:
    """Format `data` on first start; a quorum's members must all carry the same cluster id. Under `wrap` like the
    broker itself: a launcher killed meanwhile leaves the format JVM where a namespace sweep finds it."""
    meta = data / "meta.properties"
    if meta.exists():
        found = re.search(r"^cluster\.id=(\S+)$", meta.read_text(), re.MULTILINE)
        if cluster_uuid is not None and (found is None or found.group(1) != cluster_uuid):
            raise RuntimeError(f"{data} was formatted for another cluster than {cluster_uuid}: remove it to reformat")
        return
    done = subprocess.run([*wrap, *_java(libs, log4j2, "kafka.tools.StorageTool", "format", "-t",
                                cluster_uuid or random_cluster_uuid(), "-c", str(props), *scram_arguments(users))],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"formatting {data} failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-1500:]}")


def _await_exec(proc: subprocess.Popen[bytes], jvm: list[str], directory: Path) -> None:
    """Make sure the recorded PID is the JVM's: a `wrap` must exec it (as `ip netns exec` does), not fork it,
    or `stop` would signal the wrapper (whose argv names the JVM's too) and leave the JVM running."""
    deadline = time.monotonic() + EXEC_TIMEOUT
    while _cmdline(proc.pid) != jvm:
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.returncode is None:
                with suppress(ProcessLookupError):  # the group holds whatever it forked: start_new_session
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            (directory / "kafka.pid").unlink()
            raise RuntimeError("the Kafka JVM exited at once, or a `wrap` forked it instead of exec'ing it:\n"
                               + _tails([directory]))
        time.sleep(0.01)


def start(directory: Path, port: int, controller_port: int, timeout: float = 90.0, *, address: str = "127.0.0.1",
          node_id: int = 1, voters: Sequence[Voter] | None = None, replication_factor: int = 1,
          min_insync_replicas: int = 1, cluster_uuid: str | None = None, wrap: Sequence[str] = (),
          wait: bool = True, users: Mapping[str, str] | None = None, admin: str = "admin",
          tls: HostTLS | None = None, client: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """Start a broker with its data under `directory` (formatted on first start); returns (pid, bootstrap).

    Without `voters` it is a quorum of its own. `wrap` prefixes the JVM's argv and must exec it, e.g.
    ("ip", "netns", "exec", NS). With `wait` it returns once the broker serves, else at once: a quorum member
    serves only once a majority of its voters runs, so start them all and then call `wait_serving`.
    Restarting on the same directory and ports keeps every topic and committed offset.
    With `users` (name -> password, `admin` among them: the super user the brokers log in as) clients must log
    in with SASL/SCRAM-SHA-512; the users are stored at the first start's format only. With `tls` (the host's
    certificate and key, the cluster CA) too, every listener takes TLS only. `client`: the librdkafka settings the
    wait logs in with (the admin's, libs/mq/settings.client_auth, on a broker with users).
    """
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    libs = fetch()
    data = directory / "data"
    props = directory / "server.properties"
    log4j2 = directory / "log4j2.properties"
    props.write_text(server_properties(node_id=node_id, address=address, port=port, controller_port=controller_port,
                                       voters=voters or [(node_id, address, controller_port)], data_dir=data,
                                       replication_factor=replication_factor,
                                       min_insync_replicas=min_insync_replicas,
                                       admin=(admin, users[admin]) if users else None, tls=tls))
    props.chmod(0o600)  # with users it holds the admin's password, with TLS the host's key
    log4j2.write_text(LOG4J2.format(log=directory / "kafka.log"))
    _format(libs, log4j2, props, data, cluster_uuid, wrap, users or {})
    pid = relaunch(directory, wrap)
    bootstrap = f"{address}:{port}"
    if wait:
        wait_serving(bootstrap, timeout, directories=[directory], client=client)
    return pid, bootstrap


def relaunch(directory: Path, wrap: Sequence[str] = ()) -> int:
    """Launch the JVM of the broker `start` set up in `directory`, its server.properties and data as they are (a
    restarted quorum member rejoins with what it had); returns its pid at once."""
    directory = directory.resolve()
    jvm = _java(fetch(), directory / "log4j2.properties", "kafka.Kafka", str(directory / "server.properties"))
    with open(directory / "kafka.out", "ab") as out:
        proc = subprocess.Popen([*wrap, *jvm], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    (directory / "kafka.pid").write_text(f"{proc.pid}\n")
    _await_exec(proc, jvm, directory)
    return proc.pid


def wait_serving(bootstrap: str, timeout: float = 90.0, *, brokers: int | None = None,
                 directories: Sequence[Path] = (), client: Mapping[str, Any] | None = None) -> None:
    """Wait until the cluster behind `bootstrap` ("host:port,...") answers with `brokers` unfenced brokers
    (default: one per bootstrap address), so topics with that many replicas can be created.

    `directories` are the members started here: one whose JVM exits ends the wait early, and if the cluster
    does not come up they are all stopped (a quorum missing a member is of no use) and their logs quoted.
    `client`: further librdkafka settings, e.g. libs/mq/settings.client_auth's on a cluster with users.
    """
    wanted = len(bootstrap.split(",")) if brokers is None else brokers
    addresses = [_host_port(item) for item in bootstrap.split(",")]
    members = [d.resolve() for d in directories]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(_running(d) for d in members):
        if any(_port_open(*a) for a in addresses) and _serving_brokers(bootstrap, client or {}) >= wanted:
            return
        time.sleep(0.1)
    tails = _tails(members)
    for d in members:
        stop(d)
    raise RuntimeError(f"Kafka did not serve {wanted} broker(s) on {bootstrap} within {timeout}s:\n{tails}")


def stop(directory: Path, timeout: float = 30.0) -> None:
    """SIGTERM (a clean shutdown flushes the logs), then SIGKILL after `timeout`; no-op if not running."""
    directory = directory.resolve()
    pid_file = directory / "kafka.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    if _alive(pid) and _is_our_broker(pid, directory):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
    pid_file.unlink()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _voters(text: str) -> list[Voter]:
    """`1@host:port,2@host:port,...`, the syntax of controller.quorum.voters."""
    voters = []
    for item in text.split(","):
        node, _, address = item.partition("@")
        voters.append((int(node), *_host_port(address)))
    return voters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fetch", "start", "stop", "wait", "uuid"])
    parser.add_argument("--dir", type=Path, help="broker data and log directory (start, stop)")
    parser.add_argument("--port", type=int, default=9092)
    parser.add_argument("--controller-port", type=int, help="default: a free port")
    parser.add_argument("--address", default="127.0.0.1", help="where both listeners bind and are advertised")
    parser.add_argument("--node-id", type=int, default=1)
    parser.add_argument("--voters", type=_voters, help="ID@HOST:PORT,... (default: this node alone)")
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--min-insync-replicas", type=int, default=1)
    parser.add_argument("--cluster-uuid", help="the quorum's cluster id, from `uuid` (default: a random one)")
    parser.add_argument("--netns", help="run the JVM inside this network namespace (ip netns exec)")
    parser.add_argument("--no-wait", action="store_true", help="return once the JVM runs, without waiting")
    parser.add_argument("--bootstrap", help="HOST:PORT,... of the cluster to wait for (wait)")
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args(argv)
    if args.command == "fetch":
        print(fetch())
        return 0
    if args.command == "uuid":
        print(random_cluster_uuid())
        return 0
    if args.command == "wait":
        if args.bootstrap is None:
            parser.error("wait needs --bootstrap")
        wait_serving(args.bootstrap, args.timeout)
        return 0
    if args.dir is None:
        parser.error(f"{args.command} needs --dir")
    if args.command == "start":
        pid, bootstrap = start(args.dir, args.port, args.controller_port or _free_port(), args.timeout,
                               address=args.address, node_id=args.node_id, voters=args.voters,
                               replication_factor=args.replication_factor,
                               min_insync_replicas=args.min_insync_replicas, cluster_uuid=args.cluster_uuid,
                               wrap=("ip", "netns", "exec", args.netns) if args.netns else (),
                               wait=not args.no_wait)
        print(f"kafka pid {pid} at {bootstrap}")
    else:
        stop(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
