"""Buffers for multi-MiB payloads: neither zero-filled first nor page-faulted in on every use.

`uninitialized` hands out a writable buffer for bytes the kernel is about to write into (a pread, a
socket receive): `bytearray(n)` would memset it first, ~6% of the CPU of a 16 MiB GET.

By default a multi-MiB allocation is a fresh mmap, so each encode output page-faults on first
touch (~3000 faults per 4 MiB EC6P3 encode: zfec 722 -> 518 MB/s, NOTES). Shards are handed to
callers, so their buffers cannot be reused by the codec; instead, raising the mmap threshold to
64 MiB (above the 32 MiB max blob) and the trim threshold to 256 MiB lets freed stripes stay in
the heap and be reused without faults. This is process-wide, done once when this module is imported.
"""

from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 * 1024 * 1024
TRIM_THRESHOLD = 256 * 1024 * 1024


@functools.cache
def tune_malloc() -> bool:
    """Apply the thresholds; False where the C library has no `mallopt` (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def uninitialized(size: int) -> memoryview:
    """A writable `size`-byte buffer whose contents are whatever the allocator had: fill all of it."""
    import numpy as np  # ~0.1 s to import: a process that never receives a body into a buffer never pays it

    return np.empty(size, np.uint8).data


tune_malloc()
