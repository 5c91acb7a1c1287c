"""Bytes from one socket to another through a pipe in the kernel (splice(2)), never through this process's memory.

Access relays large reads from blobnodes to clients: received into a buffer and sent from it, each byte is copied
twice by the CPU (16 MiB: ~6.6 ms here); spliced, the kernel hands the received pages on (~2.9 ms). The calls run
on the event loop, like a socket's sends: a splice of a ready socket only moves page references. Both sockets are
non-blocking; waiting for one is the loop's (`add_reader`/`add_writer`), so callers pass their own `dup` of each
descriptor: a loop may not watch a transport's own, and a transport closing its socket meanwhile can then never
make these calls touch another connection that reused the number. `SocketBody` is the rest of an answer the lean
transport left in its socket (`LeanTransport.send_deferred`), moved on in spans.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from blobstore_server.libs.rpc.errors import Internal

AVAILABLE = sys.platform == "linux" and hasattr(os, "splice")
PIPE_BYTES = 1 << 20  # the default pipe-max-size: larger needs privileges
_F_SETPIPE_SZ = 1031
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


class SpliceTimeout(TimeoutError):
    """A socket was not ready for `timeout` seconds."""


class SourceEnded(ConnectionError):
    """The source socket closed before giving the bytes asked for."""


class _Pipe:
    def __init__(self) -> None:
        self.read, self.write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self.size = fcntl.fcntl(self.write, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            self.size = 64 << 10  # the kernel's default
        self.held = 0  # bytes in the pipe

    def close(self) -> None:
        os.close(self.read)
        os.close(self.write)


_idle_pipes: list[_Pipe] = []  # the loop's: every call here runs on it


def _give_back(pipe: _Pipe) -> None:
    if pipe.held:  # a failed move left bytes in it: nobody may read them
        pipe.close()
    else:
        _idle_pipes.append(pipe)


async def _ready(fd: int, writing: bool, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    watch: Callable[..., None] = loop.add_writer if writing else loop.add_reader
    watch(fd, wake)
    try:
        async with asyncio.timeout(timeout):
            await ready
    except TimeoutError:
        raise SpliceTimeout(f"no {'room to write' if writing else 'bytes to read'} for {timeout:g} s") from None
    finally:
        (loop.remove_writer if writing else loop.remove_reader)(fd)


async def write_all(dst: int, data: bytes | memoryview, timeout: float) -> None:
    """Write all of `data` to socket `dst`."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(dst, view):]
        except BlockingIOError:
            await _ready(dst, True, timeout)


async def splice_exactly(src: int, dst: int, count: int, timeout: float) -> None:
    """Move exactly `count` bytes from socket `src` to socket `dst`: raises `SpliceTimeout` when either makes no
    progress for `timeout` seconds, `SourceEnded`, or the `OSError` a socket met; after an error both streams are
    cut (close them)."""
    pipe = _idle_pipes.pop() if _idle_pipes else _Pipe()
    try:
        left = count
        while left or pipe.held:
            if left and pipe.held < pipe.size:
                try:
                    moved = os.splice(src, pipe.write, min(left, pipe.size - pipe.held), flags=_FLAGS)
                except BlockingIOError:
                    moved = -1
                if moved == 0:
                    raise SourceEnded(f"the source closed with {left} of {count} bytes to go")
                if moved > 0:
                    left -= moved
                    pipe.held += moved
                    continue  # read on while it comes: fewer, larger sends
                if not pipe.held:
                    await _ready(src, False, timeout)
                    continue
            try:
                pipe.held -= os.splice(pipe.read, dst, pipe.held, flags=_FLAGS)
            except BlockingIOError:
                await _ready(dst, True, timeout)
    finally:
        _give_back(pipe)


class SocketBody:
    """The rest of an answer's body: `prefix` (received with its first line) then bytes still in its connection's
    socket, moved straight to another socket in spans taken in order (`BodySpan`), never copied through this
    process. Taken whole, its connection serves the next request; abandoned, it is closed."""

    def __init__(self, prefix: memoryview, source: int, unread: int, settle: Callable[[bool], None],
                 timeout: float) -> None:
        self.prefix = prefix
        self.length = len(prefix) + unread
        self.timeout = timeout  # seconds a move may go without progress
        self.taken = 0
        self._settle: Callable[[bool], None] | None = settle
        self._source = os.dup(source)  # ours: the loop closing its socket never frees the number under us

    def span(self, start: int, size: int) -> BodySpan:
        if not 0 <= start <= start + size <= self.length:
            raise ValueError(f"span [{start}, {start + size}) outside a {self.length}-byte body")
        return BodySpan(self, start, size)

    async def move(self, span: BodySpan, destination: int) -> None:
        """Write `span` to socket `destination` (non-blocking, a `dup` of the caller's); the spans before it must
        have been moved. No progress for `timeout` seconds fails it; after a failure, `finish` the body."""
        if span.start != self.taken or self._settle is None:
            raise Internal(f"body bytes [{span.start}, {span.stop}) moved out of order (at {self.taken})")
        self.taken = -1  # until this move ends whole: none follows a failed or cancelled one
        start = span.start
        if start < len(self.prefix):
            await write_all(destination, self.prefix[start:span.stop], self.timeout)
            start = min(span.stop, len(self.prefix))
        if span.stop > start:
            await splice_exactly(self._source, destination, span.stop - start, self.timeout)
        self.taken = span.stop

    def finish(self) -> None:
        """Done with the body: its connection goes back to the pool if all of it was moved, else is closed."""
        if self._settle is None:
            return
        settle, self._settle = self._settle, None
        os.close(self._source)
        settle(self.taken == self.length)


@dataclass(frozen=True)
class BodySpan:
    """Bytes [start, stop) of a `SocketBody`."""

    body: SocketBody
    start: int
    size: int

    @property
    def stop(self) -> int:
        return self.start + self.size

    def __len__(self) -> int:
        return self.size
