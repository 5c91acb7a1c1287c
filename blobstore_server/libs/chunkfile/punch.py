"""Punch holes through libc fallocate: Python's os module has no PUNCH_HOLE mode."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from .errors import PunchHoleError
from .format import ALIGN

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free [offset, offset+length) while keeping the file size; both must be 4 KiB aligned."""
    if offset % ALIGN or length % ALIGN or offset < 0 or length < 0:
        raise ValueError(f"punch range {offset}+{length} is not {ALIGN}-byte aligned")
    if length == 0:
        return
    if _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise PunchHoleError(
            f"fallocate(PUNCH_HOLE) of {length} bytes at {offset} refused: "
            f"[errno {err}] {os.strerror(err)}")
