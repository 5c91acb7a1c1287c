"""Detached processes addressed by PID: start, probe, stop. A PID is only ever signalled while it still
names the process that was started (its start time is recorded), so a recycled PID is left alone."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from blobstore_server.libs.ports import free_port as free_port  # re-exported: the one port helper
from blobstore_server.libs.ports import free_ports as free_ports

# Children started by this interpreter, kept so they are reaped (no zombies) and never warned about.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None if there is no such live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    if fields[0] == "Z":
        return None
    return int(fields[19])


def spawn(command: Sequence[str], log_path: Path, cwd: Path, env: dict[str, str]) -> tuple[int, int]:
    """Start `command` in its own session (it outlives the caller); returns (pid, start time)."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=cwd, env=env, start_new_session=True)
    _CHILDREN[proc.pid] = proc
    return proc.pid, start_time(proc.pid) or 0


def running(pid: int, started: int) -> bool:
    """True while `pid` is the live process that started at `started`."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]
        return False
    now = start_time(pid)
    return now is not None and (started == 0 or now == started)


def stop(processes: Sequence[tuple[int, int]], timeout: float = 10.0) -> dict[int, str]:
    """SIGTERM every running process, SIGKILL those still there after `timeout`; each pid -> what happened."""
    outcome: dict[int, str] = {}
    for pid, started in processes:
        if running(pid, started):
            os.kill(pid, signal.SIGTERM)
            outcome[pid] = "stopped"
        else:
            outcome[pid] = "was not running"
    left = [(pid, started) for pid, started in processes if outcome[pid] == "stopped"]
    if poll(lambda: not any(running(p, s) for p, s in left), timeout):
        return outcome
    for pid, started in left:
        if running(pid, started):
            os.kill(pid, signal.SIGKILL)
            outcome[pid] = "killed"
    if not poll(lambda: not any(running(p, s) for p, s in left), 5.0):
        raise RuntimeError(f"processes survived SIGKILL: {[p for p, s in left if running(p, s)]}")
    return outcome


def poll(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Check `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """`poll`, failing with TimeoutError naming `what` when the condition never held."""
    if not poll(condition, timeout, interval):
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def _liveness_tls() -> ssl.SSLContext:
    """TLS that takes any certificate: a liveness probe sends nothing secret (a PING) and trusts no answer."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def healthy(url: str, timeout: float = 1.0, verify: ssl.SSLContext | bool = True) -> bool:
    """An HTTP service answers 200 on /health (an HTTPS one with a certificate `verify` accepts); Redis
    answers PONG (or, when it wants a password, NOAUTH), over TLS for rediss://; Kafka accepts a connection."""
    scheme, _, rest = url.partition("://")
    if scheme in ("redis", "rediss", "kafka"):
        host, port = rest.split("/", 1)[0].rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as raw:
                if scheme == "kafka":
                    return True
                s = _liveness_tls().wrap_socket(raw) if scheme == "rediss" else raw
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # a Redis with a password answers too
        except OSError:
            return False
    try:
        return httpx.get(f"{url}/health", timeout=timeout, verify=verify).status_code == 200
    except httpx.HTTPError:
        return False
