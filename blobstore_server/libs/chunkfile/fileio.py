"""The file I/O under a chunk: whole writes of buffer lists, directory syncs, and O_DIRECT reads and writes through
each thread's page-aligned staging buffer on a descriptor opened beside the chunk's own."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from pathlib import Path

from . import format as fmt

IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
# O_DIRECT wants the offset, the length and the buffer aligned to the device's logical block: a page covers any.
DIRECT_ALIGN = mmap.PAGESIZE


def pwritev_all(fd: int, bufs: list[memoryview | bytes], offset: int) -> None:
    """pwritev that survives short writes and lists longer than IOV_MAX."""
    views = [memoryview(b) for b in bufs]
    i = 0
    while i < len(views):
        n = os.pwritev(fd, views[i:i + IOV_MAX], offset)
        if n == 0 and any(v.nbytes for v in views[i:i + IOV_MAX]):
            raise OSError(f"pwritev wrote nothing at offset {offset}")
        offset += n
        while i < len(views) and n >= views[i].nbytes:
            n -= views[i].nbytes
            i += 1
        if n:
            views[i] = views[i][n:]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Staging(threading.local):
    """Each thread's page-aligned buffer for direct I/O, kept: a fresh one would page-fault on every use."""

    def __init__(self) -> None:
        self.buffer = mmap.mmap(-1, DIRECT_ALIGN)

    def region(self, length: int) -> memoryview:
        """The first `length` bytes of the buffer, grown first if needed; valid until this thread's next call."""
        if len(self.buffer) < length:
            self.buffer.close()
            self.buffer = mmap.mmap(-1, fmt.align_up(length, 1 << 20))
        return memoryview(self.buffer)[:length]

    def image(self, bufs: list[memoryview | bytes], length: int) -> memoryview:
        """`bufs` one after the other, zero-padded to `length` (a multiple of DIRECT_ALIGN)."""
        image = self.region(length)
        pos = 0
        for buf in bufs:
            image[pos:pos + len(buf)] = buf
            pos += len(buf)
        image[pos:] = bytes(length - pos)
        return image


staging = Staging()


def pread_direct(fd: int, views: list[memoryview], offset: int) -> int:
    """`os.preadv(fd, views, offset)` for an O_DIRECT `fd`: the enclosing aligned range into this thread's staging
    buffer, then copied out to `views`."""
    start = offset // DIRECT_ALIGN * DIRECT_ALIGN
    want = sum(view.nbytes for view in views)
    region = staging.region(fmt.align_up(offset + want, DIRECT_ALIGN) - start)
    got = 0
    while got < len(region):
        n = os.preadv(fd, [region[got:]], start + got)
        if n == 0:  # the end of the file
            break
        got += n
    pos, end = offset - start, min(got, offset - start + want)
    for view in views:
        take = max(0, min(view.nbytes, end - pos))
        view[:take] = region[pos:pos + take]
        pos += take
    return max(0, end - (offset - start))


class Descriptors:
    """A chunk file's descriptor, and the O_DIRECT one opened beside it on first use."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self._direct: int | None = None
        self._refused = False  # the file system refused O_DIRECT: direct I/O goes through the page cache
        self._lock = threading.Lock()

    def direct(self) -> int | None:
        """The O_DIRECT descriptor, opened once with the access mode of the chunk's own (a chunk opened read-only
        reads direct too); None where the file system refuses O_DIRECT."""
        with self._lock:
            if self._direct is None and not self._refused:
                try:
                    mode = fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_ACCMODE
                    self._direct = os.open(self.path, mode | os.O_DIRECT)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._refused = True
            return self._direct

    def close(self) -> None:
        os.close(self.fd)
        if self._direct is not None:
            os.close(self._direct)
