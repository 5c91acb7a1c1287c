"""The blobnode's side of its background reader (services/blobnode/reader_app.py): start it on the first
background read, advertise its URL once it listens (`NodeStat.background_host`), start it again if it dies,
stop it with the blobnode.

Started on demand, not with the blobnode: a node that never serves a repair or a migration never pays for a
second process. It dies with the blobnode even on SIGKILL (PR_SET_PDEATHSIG), and it is started from the event
loop's thread, which lives as long as the process (the signal follows the thread that forked).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from blobstore_server.libs.ports import free_port
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.reader_app import BIND_ENV

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1
RESTART_AFTER = 1.0  # seconds between a reader's death and the next start
READY_WITHIN = 60.0  # seconds a new reader has to listen before it is stopped and started again
_POLL = 0.2


def _in_background(parent: int) -> None:
    """In the forked child, before exec: run in the background from the start (its imports take ~1 s of CPU), be
    killed when the blobnode dies, and if it died already, go.

    In the background twice over, as kernels share CPU: with autogroups on (Debian's and Ubuntu's default; a
    process outside any cpu cgroup shares the CPU per session first, and SCHED_IDLE or nice then only rank it
    within its session) it is a session of its own, whose group runs at nice 19; and it is SCHED_IDLE where
    processes share the CPU one by one."""
    os.setsid()
    with contextlib.suppress(OSError):  # no autogroups in this kernel
        Path("/proc/self/autogroup").write_text("19")
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


class ReaderProcess:
    def __init__(self, config: BlobnodeConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.argv = list(argv)  # the blobnode's own flags: the reader reads the same config
        self.url = ""  # where the reader listens, once it does
        self.process: subprocess.Popen[bytes] | None = None
        self._keeper: asyncio.Task[None] | None = None

    def wanted(self) -> None:
        """A background read arrived: have a reader (from the event loop's thread)."""
        if self.config.background_reader and self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        while True:
            await self._run_once()
            await asyncio.sleep(RESTART_AFTER)

    async def _run_once(self) -> None:
        bind_host = self.config.bind_addr.rpartition(":")[0] or "127.0.0.1"
        port = free_port(bind_host)
        process = subprocess.Popen(
            [sys.executable, "-m", "blobstore_server.services.blobnode.reader_app", *self.argv],
            env={**os.environ, BIND_ENV: f"{bind_host}:{port}"}, stdin=subprocess.DEVNULL,
            preexec_fn=partial(_in_background, os.getpid()))
        self.process = process
        try:
            if not await self._listening(process, bind_host, port):
                log.warning("background reader (pid %d) did not listen on port %d: starting another", process.pid,
                            port)
                return
            advertised = urlsplit(self.config.advertised_host)
            self.url = f"{advertised.scheme}://{advertised.hostname}:{port}"
            log.info("background reader (pid %d) serves background reads at %s", process.pid, self.url)
            while process.poll() is None:
                await asyncio.sleep(_POLL)
            log.warning("background reader (pid %d) exited with %s: background reads go to the blobnode meanwhile",
                        process.pid, process.returncode)
        finally:
            self.url = ""
            _stop(process)

    @staticmethod
    async def _listening(process: subprocess.Popen[bytes], host: str, port: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_WITHIN
        while process.poll() is None and loop.time() < deadline:
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(host, port)
                writer.close()
                return True
            await asyncio.sleep(_POLL)
        return False

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None


def _stop(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
