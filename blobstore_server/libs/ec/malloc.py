"""Keep glibc from returning multi-MiB buffers to the kernel after every encode.

By default a multi-MiB allocation is a fresh mmap, so each encode output page-faults on first
touch (~3000 faults per 4 MiB EC6P3 encode: zfec 722 -> 518 MB/s, NOTES). Shards are handed to
callers, so their buffers cannot be reused by the codec; instead, raising the mmap threshold to
64 MiB (above the 32 MiB max blob) and the trim threshold to 256 MiB lets freed stripes stay in
the heap and be reused without faults. This is process-wide, done once at import.
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
