"""Start real service processes on 127.0.0.1 for tests, and stop them by PID."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from blobstore_server.cluster.procs import free_port as free_port  # the one port helper, for the tests too
from blobstore_server.cluster.procs import healthy
from blobstore_server.cluster.procs import wait_until as wait_until  # the one polling helper, for the tests too
from blobstore_server.cluster.service_auth import MESSAGE_ROLES, with_auth
from blobstore_server.libs.proto.routes import CATALOG
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import AUTH_HEADER, SESSION_HEADER, AuthConfig, Signer, new_secret
from blobstore_server.libs.rpc.routes import Capability

REPO = Path(__file__).resolve().parents[2]
# One secret per test session (pytest process): every service a test starts signs and checks with keys derived
# from it, and the test process signs as the operator with it (tests/conftest.py `signed_as_operator`).
TEST_SECRET = new_secret()


def secured(role: str, config: dict[str, Any], insecure: bool = False) -> dict[str, Any]:
    """`config` with the keys of its role as `cluster up` would give them, unless it has
    `auth` or `insecure` already; with `insecure`, `insecure: true` instead (tests of the open mode)."""
    if "auth" in config or config.get("insecure"):
        return config
    if insecure:
        return {**config, "insecure": True}
    if role in MESSAGE_ROLES and "kafka_auth" not in config:
        config = {**config, "insecure": True}  # the tests' own broker (tests/support/kafka.py) takes no logins
    return with_auth(TEST_SECRET, role, config)


class Signed(httpx.Auth):
    """`httpx.get(url, auth=SIGNED)`: a raw request signed as this process signs (`auth.installed()`), as the
    services' own clients sign theirs; unsigned when nothing is installed."""

    requires_request_body = True

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        signer = auth.installed()
        if signer is not None and AUTH_HEADER not in request.headers:
            request.headers[AUTH_HEADER] = signer.header(request.method, str(request.url), None, request.content,
                                                         CATALOG, request.headers.get(SESSION_HEADER, ""))
        yield request


SIGNED = Signed()


@contextmanager
def signing_with(signer: Signer | None) -> Iterator[None]:
    """Sign this process's requests with `signer` (None: unsigned) for a while."""
    before = auth.installed()
    auth.install(signer)
    try:
        yield
    finally:
        auth.install(before)


def signing_as(name: str) -> AbstractContextManager[None]:
    """Sign as the process named `name` (e.g. a blobnode's host: its disk reports), holding every capability."""
    return signing_with(Signer.from_config(AuthConfig.for_capabilities(TEST_SECRET, Capability, name=name)))


@dataclass
class Service:
    """A service process started from a JSON config; `url` is its HTTP base."""

    role: str  # the service's package under blobstore_server/services, e.g. "blobnode"
    config: dict[str, Any]
    workdir: Path
    url: str
    verify: ssl.SSLContext | bool = True  # for an https:// url: what its certificate is checked against
    insecure: bool = False  # start with `insecure: true` rather than the role's keys (unless config says)
    under: tuple[str, ...] = ()  # a command that execs the service, e.g. prlimit to start it with other limits
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / f"{self.role}.log"

    @property
    def module(self) -> str:
        return f"blobstore_server.services.{self.role}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 15.0) -> Service:
        """Start the process and wait until it answers."""
        return self.spawn().ready(timeout)

    def spawn(self) -> Service:
        """Start the process without waiting for it (`ready` does): a batch spawned at once starts in parallel."""
        conf_path = self.workdir / "conf.json"
        self.config = secured(self.role, self.config, self.insecure)
        conf_path.write_text(json.dumps(self.config))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*self.under, sys.executable, "-m", self.module, "-c", str(conf_path)],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        return self

    def ready(self, timeout: float = 15.0) -> Service:
        """Wait until the spawned process answers its health check."""
        proc = self.proc
        assert proc is not None, "spawn first"
        try:
            wait_until(lambda: proc.poll() is not None or healthy(self.url, verify=self.verify),
                       timeout, f"{self.module} at {self.url}")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"{self.module} did not answer:\n{self.log_path.read_text()[-3000:]}") from None
        if proc.poll() is not None:
            raise RuntimeError(f"{self.module} exited with {proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
        return self

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        if self.proc is None:
            return
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill9()


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R running, S sleeping, T stopped by a signal, ...)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2:].split()[0]


class Pauses:
    """SIGSTOP and SIGCONT services by PID, each pause counted only once the kernel shows the process stopped;
    whatever is still stopped is let go on leaving, also when the test fails."""

    def __init__(self) -> None:
        self.stopped: list[Service] = []

    def stop(self, service: Service) -> None:
        os.kill(service.pid, signal.SIGSTOP)
        self.stopped.append(service)
        wait_until(lambda: process_state(service.pid) == "T", 5, f"{service.module} {service.pid} stopped")

    def cont(self, service: Service) -> None:
        os.kill(service.pid, signal.SIGCONT)
        self.stopped.remove(service)
        wait_until(lambda: process_state(service.pid) != "T", 5, f"{service.module} {service.pid} running again")

    def __enter__(self) -> Pauses:
        return self

    def __exit__(self, *exc: object) -> None:
        for service in list(self.stopped):
            self.cont(service)


def start_all(services: Sequence[Service], timeout: float = 30.0) -> None:
    """Spawn every service, then wait for each: they import and start side by side."""
    for service in services:
        service.spawn()
    for service in services:
        service.ready(timeout)


def stop_all(services: list[Service]) -> None:
    """SIGTERM every process first, then wait for each (by PID): teardown in parallel."""
    for service in services:
        service.terminate()
    for service in services:
        service.stop()


BlobnodeFactory = Callable[..., Service]


@dataclass(frozen=True)
class RedisServer:
    """A redis-server a test started (tests/conftest.py `redis_server`)."""

    url: str
    process: subprocess.Popen[bytes]


@dataclass
class LocalCluster:
    clustermgr: list[Service]
    blobnodes: list[Service]
    allocators: list[Service]
    access: list[Service]
    add_access: Callable[..., Service]  # another access node of the same cluster
    background: dict[str, Service] = field(default_factory=dict)  # worker, mqproxy, tinker when started
    secret: ClassVar[str] = "test-cluster-secret"

