"""Start and stop a Spark standalone cluster (one master, one worker) on 127.0.0.1 from pyspark's own jars.

The same `blobstore inspect run|backlog --master spark://127.0.0.1:PORT` then runs there unchanged. Both JVMs
run detached; their PIDs are kept in DIR/master.pid and DIR/worker.pid and they are stopped by PID only.

    python deploy/spark/standalone.py start --dir DIR [--port P] [--cores N] [--memory 1g]
    python deploy/spark/standalone.py stop --dir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

from blobstore_server.cluster.procs import free_ports, poll, start_time
from blobstore_server.cluster.procs import stop as stop_pids

SPARK_HOME = Path(pyspark.__file__).resolve().parent
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class Standalone:
    master_url: str  # spark://127.0.0.1:PORT, for --master
    ui_url: str  # the master's web UI; /json/ lists the workers
    master_pid: int
    worker_pid: int


def _env(directory: Path) -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(directory), "SPARK_DAEMON_MEMORY": "384m", "SPARK_NO_DAEMONIZE": "1"}


def _spawn(directory: Path, name: str, args: list[str]) -> int:
    with open(directory / f"{name}.log", "ab") as log:
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, env=_env(directory), cwd=directory,
                                start_new_session=True)
    (directory / f"{name}.pid").write_text(f"{proc.pid} {start_time(proc.pid) or 0}\n")
    return proc.pid


def _alive_workers(ui_url: str) -> int:
    try:
        with urllib.request.urlopen(f"{ui_url}/json/", timeout=2) as answer:
            state = json.load(answer)
    except (OSError, ValueError):
        return 0
    return sum(w.get("state") == "ALIVE" for w in state.get("workers", []))


def start(directory: Path, port: int = 0, cores: int = 2, memory: str = "1g", timeout: float = 90.0) -> Standalone:
    """A master and one worker with `cores` and `memory` for executors; returns once the worker registered."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    port, ui_port, worker_ui = (port, *free_ports(2)) if port else free_ports(3)
    master_url, ui_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
    master = _spawn(directory, "master", [MASTER, "--host", "127.0.0.1", "--port", str(port),
                                          "--webui-port", str(ui_port)])
    worker = _spawn(directory, "worker", [WORKER, "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                                          "--webui-port", str(worker_ui), "--work-dir", str(directory / "work"),
                                          master_url])
    if not poll(lambda: _alive_workers(ui_url) >= 1, timeout, interval=0.25):
        stop(directory)
        tail = "".join((directory / f"{n}.log").read_text(errors="replace")[-1500:] for n in ("master", "worker"))
        raise RuntimeError(f"the Spark master at {master_url} has no live worker after {timeout}s:\n{tail}")
    return Standalone(master_url, ui_url, master, worker)


def stop(directory: Path, timeout: float = 20.0) -> None:
    """Stop the worker, then the master, by the PIDs recorded at start (SIGTERM, SIGKILL after `timeout`)."""
    for name in ("worker", "master"):
        pid_file = directory.resolve() / f"{name}.pid"
        if pid_file.exists():
            pid, started = (int(x) for x in pid_file.read_text().split())
            stop_pids([(pid, started)], timeout)
            pid_file.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("--dir", type=Path, required=True, help="logs, PID files and the worker's work dir")
    parser.add_argument("--port", type=int, default=7077)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--memory", default="1g")
    args = parser.parse_args(argv)
    if args.command == "start":
        cluster = start(args.dir, args.port, args.cores, args.memory)
        print(f"master {cluster.master_url} (pid {cluster.master_pid}, UI {cluster.ui_url}), "
              f"worker pid {cluster.worker_pid}")
    else:
        stop(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
