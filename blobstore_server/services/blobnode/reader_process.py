"""The blobnode's side of its background reader (services/blobnode/reader_app.py): start it on the first
background read, advertise its URL once it listens (`NodeStat.background_host`), start it again if it dies,
stop it with the blobnode.

Readers are forked, not spawned: a fresh interpreter spent ~0.8 s of CPU on its imports, which every blobnode
paid at the start of a cluster's first repair, eight of them at once on a small box. A fork server
(`ReaderForks`), forked from the blobnode before it starts any thread (forking a threaded process is unsafe),
holds the blobnode's imports and forks a reader on demand; it passes back a pidfd, through which the blobnode
watches and stops a reader that is not its child. Started on demand, not with the blobnode: a node that never
serves a repair or a migration never pays for a second process. Each dies with its parent even on SIGKILL
(PR_SET_PDEATHSIG; both forking processes are single-threaded then, and the signal follows the thread that
forked): blobnode, fork server, reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from blobstore_server.libs import cpugroup
from blobstore_server.libs.ports import free_port
from blobstore_server.services.blobnode import reader_app
from blobstore_server.services.blobnode.config import BlobnodeConfig

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1
RESTART_AFTER = 1.0  # seconds between a reader's death and the next start
READY_WITHIN = 60.0  # seconds a new reader has to listen before it is stopped and started again
_POLL = 0.2


def _die_with(parent: int) -> None:
    """Be killed when `parent` dies, and if it died already, go."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _in_background() -> None:
    """In the background however the kernel shares CPU: in an idle cpu cgroup where one can be made (preempted at
    once by any other task, libs/cpugroup.py); else, with autogroups on (Debian's and Ubuntu's default; a process
    outside any cpu cgroup shares the CPU per session first, and SCHED_IDLE or nice then only rank it within its
    session), a session of its own whose group runs at nice 19; and SCHED_IDLE where processes share the CPU one
    by one. Threads started later inherit all of it."""
    os.setsid()
    with contextlib.suppress(OSError):  # no autogroups in this kernel
        Path("/proc/self/autogroup").write_text("19")
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    cpugroup.enter_idle_group()


def _become_reader(bind: str, parent: int) -> NoReturn:
    """The forked reader: leave the fork server's ways and serve (`reader_app.main`) until told to stop."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _in_background()
        _die_with(parent)
        os.environ[reader_app.BIND_ENV] = bind
        logging.root.handlers.clear()  # its log lines say they are the reader's
        reader_app.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("background reader failed")
    finally:
        os._exit(code)  # never back into the fork server's stack


def _serve_forks(requests: socket.socket, parent: int) -> NoReturn:
    """The fork server: for each bind address asked for, fork a reader and send back its pid and a pidfd. Ends
    when the blobnode closes its end (or dies)."""
    try:
        _die_with(parent)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the blobnode, which ends this
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps readers; the blobnode watches pidfds
        with requests.makefile("rb") as lines:
            for line in lines:
                pid = os.fork()
                if pid == 0:
                    requests.close()
                    _become_reader(line.decode().strip(), os.getppid())
                try:
                    pidfd = os.pidfd_open(pid)
                except ProcessLookupError:  # it died at once and was reaped
                    requests.sendall(b"0\n")
                    continue
                socket.send_fds(requests, [f"{pid}\n".encode()], [pidfd])
                os.close(pidfd)
    finally:
        os._exit(0)


class ForkServerGone(Exception):
    """The fork server died: no reader can be started any more (background reads stay on the blobnode)."""


class ReaderForks:
    """The blobnode's handle on its fork server."""

    def __init__(self, requests: socket.socket, pid: int) -> None:
        self._requests = requests
        self.pid = pid
        self._lock = threading.Lock()

    @classmethod
    def start(cls) -> ReaderForks | None:
        """Fork the fork server; None (with a warning) once a thread runs here: that fork would be unsafe."""
        if threading.active_count() > 1:
            log.warning("background reader: a thread already runs here, so no fork server: background reads stay "
                        "on the blobnode")
            return None
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _serve_forks(theirs, parent)
        theirs.close()
        return cls(ours, pid)

    def fork_reader(self, bind: str) -> tuple[int, int]:
        """(pid, pidfd) of a new reader listening on `bind` soon (blocking: call it from a thread)."""
        with self._lock:
            try:
                self._requests.sendall(f"{bind}\n".encode())
                answer, fds, _, _ = socket.recv_fds(self._requests, 64, 1)
            except OSError as exc:
                raise ForkServerGone(str(exc)) from exc
        if not answer:
            raise ForkServerGone("it closed its end")
        if not fds:
            raise ChildProcessError("the reader died as it was forked")
        return int(answer), fds[0]

    def close(self, grace: float = 2.0) -> None:
        """End the fork server (it reads the end of its requests) and reap it."""
        self._requests.close()
        deadline = time.monotonic() + grace
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                return
            time.sleep(0.01)


class ReaderProcess:
    def __init__(self, config: BlobnodeConfig, forks: ReaderForks | None) -> None:
        self.config = config
        self.forks = forks
        self.url = ""  # where the reader listens, once it does
        self.pid = 0  # the current reader's
        self._keeper: asyncio.Task[None] | None = None

    def wanted(self) -> None:
        """A background read arrived: have a reader (from the event loop's thread)."""
        if self.forks is not None and self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        while True:
            try:
                await self._run_once()
            except ForkServerGone as exc:
                log.error("background reader: the fork server is gone (%s): background reads stay on the blobnode",
                          exc)
                return
            except ChildProcessError as exc:
                log.warning("background reader: %s", exc)
            await asyncio.sleep(RESTART_AFTER)

    async def _run_once(self) -> None:
        assert self.forks is not None
        bind_host = self.config.bind_addr.rpartition(":")[0] or "127.0.0.1"
        port = free_port(bind_host)
        pid, pidfd = await asyncio.to_thread(self.forks.fork_reader, f"{bind_host}:{port}")
        self.pid = pid
        exited = _exit_of(pidfd)
        try:
            if not await self._listening(exited, bind_host, port):
                log.warning("background reader (pid %d) did not listen on port %d: starting another", pid, port)
                return
            advertised = urlsplit(self.config.advertised_host)
            self.url = f"{advertised.scheme}://{advertised.hostname}:{port}"
            log.info("background reader (pid %d) serves background reads at %s", pid, self.url)
            await exited
            log.warning("background reader (pid %d) exited: background reads go to the blobnode meanwhile", pid)
        finally:
            self.url = ""
            await _stop(pidfd, exited)
            os.close(pidfd)

    @staticmethod
    async def _listening(exited: asyncio.Future[None], host: str, port: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_WITHIN
        while not exited.done() and loop.time() < deadline:
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
        if self.forks is not None:
            await asyncio.to_thread(self.forks.close)
        group = cpugroup.idle_group_beside()
        if group is not None:
            await asyncio.to_thread(cpugroup.remove_idle_group, group)  # stays while another process runs there


def _exit_of(pidfd: int) -> asyncio.Future[None]:
    """A future done when the process behind `pidfd` has exited (its pidfd turns readable)."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def done() -> None:
        loop.remove_reader(pidfd)
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, done)
    return exited


async def _stop(pidfd: int, exited: asyncio.Future[None], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if exited.done():
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), grace)
    await exited
