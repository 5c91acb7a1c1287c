"""A real PostgreSQL server (Debian's, which `make setup` installs) for tests and benches: a data directory of its
own under /tmp, started as the `postgres` user (it refuses to run as root) on a free port of 127.0.0.1 with fsync
on (the namespace's durability is what it is there for), stopped by its PID and removed on the way out, also when
the caller fails. Clients connect over TCP as `postgres` with no password (trust on 127.0.0.1, a test's server)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.processes import free_port, wait_until

PG_ROOT = Path("/usr/lib/postgresql")  # Debian's versioned layout; /usr/local/bin's links are a local convenience
OWNER = "postgres"


def binaries() -> Path:
    """The bin directory of the newest PostgreSQL installed; none is an error, never a skip."""
    found = sorted((p.parent for p in PG_ROOT.glob("*/bin/postgres")),
                   key=lambda b: tuple(int(n) for n in b.parent.name.split(".") if n.isdigit()))
    if not found:
        raise RuntimeError(f"no PostgreSQL under {PG_ROOT}: `make setup` installs Debian's postgresql")
    return found[-1]


def _as_owner() -> dict[str, Any]:
    """Popen's arguments that run a command as `postgres` when this process is root (as itself otherwise)."""
    return {"user": OWNER, "group": OWNER, "extra_groups": []} if os.geteuid() == 0 else {}


@dataclass
class PostgresServer:
    directory: Path  # data/, the unix socket and the log
    port: int
    process: subprocess.Popen[bytes]
    _made: Iterator[int] = field(default_factory=count)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{OWNER}@127.0.0.1:{self.port}/{database}"

    def new_schema(self) -> str:
        """A DSN whose tables go to a fresh, empty schema of its own (5 ms; a CREATE DATABASE takes 100-200)."""
        name = f"t{next(self._made)}"
        with psycopg.connect(self.dsn(), autocommit=True) as db:
            db.execute(f"CREATE SCHEMA {name}")
        return f"{self.dsn()}?options=-csearch_path%3D{name}"

    def log(self) -> str:
        return (self.directory / "postgres.log").read_text(errors="replace")


def _accepts(dsn: str) -> bool:
    try:
        psycopg.connect(dsn, connect_timeout=1).close()
    except psycopg.OperationalError:
        return False
    return True


@contextmanager
def running_postgres(timeout: float = 60.0) -> Iterator[PostgresServer]:
    """initdb into a new directory, start `postgres` there and yield it once it accepts connections."""
    bindir = binaries()
    # /tmp, not pytest's 0700 temporary folders: `postgres` must be able to reach its directory
    directory = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
    try:
        if os.geteuid() == 0:
            owner = pwd.getpwnam(OWNER)
            os.chown(directory, owner.pw_uid, owner.pw_gid)
        with open(directory / "postgres.log", "ab") as log:
            subprocess.run([str(bindir / "initdb"), "-D", str(directory / "data"), "-U", OWNER, "--auth=trust",
                            "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
                           stdout=log, stderr=subprocess.STDOUT, check=True, **_as_owner())
            port = free_port()
            process = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(directory / "data"), "-p", str(port), "-k", str(directory),
                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on", "-c", "synchronous_commit=on"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, **_as_owner())
        server = PostgresServer(directory, port, process)
        try:
            wait_until(lambda: process.poll() is not None or _accepts(server.dsn()), timeout, "postgres to start")
            if process.poll() is not None:
                raise RuntimeError(f"postgres exited with {process.returncode}:\n{server.log()[-3000:]}")
            yield server
        finally:
            _stop(process)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Fast shutdown (SIGINT: sessions ended, a checkpoint written), then SIGKILL if it does not end."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGINT)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session, started the first time a test asks for it."""
    with running_postgres() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN of a schema of the test's own on the session's server."""
    return postgres_server.new_schema()
