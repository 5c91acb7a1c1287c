"""Runs kvserver processes on 127.0.0.1 for the integration tests and the benchmark.

Every process is tracked by PID; `close()` kills whatever is still running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from blobstore_server.libs.ports import free_port
from tests.support.raftkv.kvclient import KVClient
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]


class LocalCluster:
    def __init__(self, base: Path, n: int = 3, **raft: Any) -> None:
        self.base = base
        self.raft = raft
        self.peer_addr: dict[int, str] = {}
        self.client_addr: dict[int, str] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.clients: list[KVClient] = []
        for i in range(1, n + 1):
            self._allocate(i)
        self.initial = dict(self.peer_addr)

    def _allocate(self, i: int) -> None:
        self.peer_addr[i] = f"127.0.0.1:{free_port()}"
        self.client_addr[i] = f"127.0.0.1:{free_port()}"

    def data_dir(self, i: int) -> Path:
        return self.base / f"node{i}"

    def add_node(self) -> int:
        """Allocate ports for a new node (started with `start(i, join=True)`)."""
        i = max(self.peer_addr) + 1
        self._allocate(i)
        return i

    def start(self, i: int, join: bool = False) -> None:
        conf = {
            "raft": {"node_id": i, "peers": self.initial, "data_dir": str(self.data_dir(i)),
                     "listen": self.peer_addr[i], "join": join, **self.raft},
            "client": self.client_addr[i],
        }
        path = self.base / f"node{i}.json"
        self.base.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(conf))
        log = open(self.base / f"node{i}.log", "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.procs[i] = subprocess.Popen([sys.executable, "-m", "tests.support.raftkv.kvserver", "-c", str(path)],
                                         stdout=log, stderr=log, cwd=ROOT, env=env)
        log.close()

    def start_all(self) -> None:
        for i in self.initial:
            self.start(i)

    def kill(self, i: int) -> None:
        """SIGKILL: no chance to flush anything."""
        proc = self.procs.pop(i, None)
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def stop(self, i: int) -> None:
        proc = self.procs.pop(i, None)
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wipe(self, i: int) -> None:
        shutil.rmtree(self.data_dir(i), ignore_errors=True)

    def running(self) -> list[int]:
        return [i for i, p in self.procs.items() if p.poll() is None]

    def close(self) -> None:
        for i in list(self.procs):
            self.kill(i)

    def client(self, **kw: Any) -> KVClient:
        """A client of every node (including nodes added later); closed by `close_clients`."""
        client = KVClient(self.client_addr, **kw)
        client.addrs = self.client_addr
        self.clients.append(client)
        return client

    async def close_clients(self) -> None:
        for client in self.clients:
            await client.close()
        self.clients.clear()

    async def leader(self, client: KVClient, among: list[int] | None = None) -> int | None:
        """The node that says it leads the highest term, among running nodes."""
        best: tuple[int, int] | None = None
        for i in among or self.running():
            st = await client.try_status(i)
            if st and st["role"] == "leader" and (best is None or st["term"] > best[0]):
                best = (st["term"], i)
        return best[1] if best else None

    async def wait_leader(self, client: KVClient, timeout: float = 10.0) -> int:
        found: list[int] = []

        async def has_leader() -> bool:
            lead = await self.leader(client)
            if lead is not None:
                found.append(lead)
            return lead is not None

        await eventually(has_leader, timeout, "a leader")
        return found[-1]

    async def wait_converged(self, client: KVClient, nodes: list[int], timeout: float = 20.0) -> dict[int, Any]:
        """Wait until `nodes` report the same applied index and equal state checksums there."""
        seen: dict[int, Any] = {}

        async def same() -> bool:
            for i in nodes:
                try:
                    seen[i] = await client.checksum(i)
                except (OSError, ConnectionError, TimeoutError):
                    return False
            return len({(c["applied"], c["checksum"]) for c in seen.values()}) == 1

        await eventually(same, timeout, f"nodes {nodes} to converge", every=0.05)
        return seen
