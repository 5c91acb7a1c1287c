"""Fetch, start and stop one local Kafka broker (KRaft, broker+controller in one JVM) on 127.0.0.1.

The jars come from Maven Central through `pom.xml` beside this file and are cached outside git: `make setup`
fetches them once (`fetch`). The broker runs detached and is stopped by the PID in `DIR/kafka.pid`, never by
name.

    python deploy/kafka/broker.py fetch
    python deploy/kafka/broker.py start --dir DIR [--port P] [--controller-port C]
    python deploy/kafka/broker.py stop --dir DIR
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from libs.maven import cache_root, fetch_jars

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
# C1 only and a small serial heap: the JVM starts ~1 s faster on 2 cores; plenty for tests and the demo.
JVM_OPTS = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]

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
node.id=1
controller.quorum.voters=1@127.0.0.1:{cport}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
"""


def kafka_version() -> str:
    """The broker version, declared once in pom.xml."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise RuntimeError(f"no <kafka.version> in {POM}")
    return match.group(1)


def jar_dir() -> Path:
    return cache_root() / f"kafka-{kafka_version()}" / "libs"


def fetch() -> Path:
    """Copy the broker jars into the cache once; later calls return at once."""
    return fetch_jars(POM, jar_dir(), "kafka_2.13-*.jar")


def _java(libs: Path, log4j2: Path, main: str, *args: str) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java (OpenJDK 17+) is needed to run Kafka: apt-get install openjdk-17-jre-headless")
    return [java, *JVM_OPTS, f"-Dlog4j2.configurationFile={log4j2}", "-cp", f"{libs}/*", main, *args]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _metadata_ok(bootstrap: str) -> bool:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    except KafkaError:
        return False
    try:
        admin.list_topics()
        return True
    except KafkaError:
        return False
    finally:
        admin.close()


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


def _is_our_broker(pid: int, directory: Path) -> bool:
    """Guards against a recycled PID: only a kafka.Kafka JVM started on this DIR is ever signalled."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and str(directory / "server.properties").encode() in cmdline


def start(directory: Path, port: int, controller_port: int, timeout: float = 90.0) -> tuple[int, str]:
    """Start a broker with its data under `directory` (formatted on first start) and wait until it serves.

    Restarting on the same directory and ports keeps every topic and committed offset.
    """
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    libs = fetch()
    data = directory / "data"
    props = directory / "server.properties"
    log4j2 = directory / "log4j2.properties"
    props.write_text(SERVER_PROPERTIES.format(port=port, cport=controller_port, data=data))
    log4j2.write_text(LOG4J2.format(log=directory / "kafka.log"))
    if not (data / "meta.properties").exists():
        cluster_id = subprocess.run(_java(libs, log4j2, "kafka.tools.StorageTool", "random-uuid"),
                                    capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(_java(libs, log4j2, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)),
                       capture_output=True, text=True, check=True)
    with open(directory / "kafka.out", "ab") as out:
        proc = subprocess.Popen(_java(libs, log4j2, "kafka.Kafka", str(props)), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    (directory / "kafka.pid").write_text(f"{proc.pid}\n")
    bootstrap = f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if _port_open(port) and _metadata_ok(bootstrap):
            return proc.pid, bootstrap
        time.sleep(0.1)
    stop(directory)
    tail = "".join((directory / name).read_text(errors="replace")[-2000:] for name in ("kafka.out", "kafka.log")
                   if (directory / name).exists())
    raise RuntimeError(f"Kafka did not start on {bootstrap} within {timeout}s:\n{tail}")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fetch", "start", "stop"])
    parser.add_argument("--dir", type=Path, help="broker data and log directory (start, stop)")
    parser.add_argument("--port", type=int, default=9092)
    parser.add_argument("--controller-port", type=int, help="default: a free port")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        print(fetch())
        return 0
    if args.dir is None:
        parser.error(f"{args.command} needs --dir")
    if args.command == "start":
        pid, bootstrap = start(args.dir, args.port, args.controller_port or _free_port())
        print(f"kafka pid {pid} at {bootstrap}")
    else:
        stop(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
