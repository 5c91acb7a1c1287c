"""What of a file is in the page cache, and dropping it for sure.

Residency is asked with cachestat(2) (Linux 6.5+), which only counts. Not with a `RWF_NOWAIT` read (a miss
starts readahead, which can finish before the read looks again), nor mincore (its mmap of the file makes the
next `RWF_NOWAIT` read find its pages far more often).
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

_SYS_CACHESTAT = 451  # the same number on every architecture
_libc = ctypes.CDLL(None, use_errno=True)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def resident_pages(path: Path, offset: int = 0, length: int = 0) -> int:
    """Pages of `path` holding bytes [offset, offset + length) in the page cache; length 0: to the end."""
    fd = os.open(path, os.O_RDONLY)
    try:
        stat = _Stat()
        if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(_Range(offset, length)), ctypes.byref(stat), 0) != 0:
            raise OSError(ctypes.get_errno(), "cachestat")
        return int(stat.cache)
    finally:
        os.close(fd)


def drop(path: Path, timeout: float = 5.0) -> None:
    """Every clean page of `path` out of the page cache. One `POSIX_FADV_DONTNEED` now and then leaves a page
    (one still held in another CPU's batch), so ask again until none is left."""
    deadline = time.monotonic() + timeout
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            left = resident_pages(path)
            if not left:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{left} pages of {path} stay in the page cache")
            time.sleep(0.01)
    finally:
        os.close(fd)
