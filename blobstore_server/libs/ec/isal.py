"""Reed-Solomon over ISA-L, called directly through ctypes.

Why direct: pyeclib adds an 80-byte header per fragment and holds the GIL; ISA-L itself runs at
memcpy speed and ctypes releases the GIL for the call. The Cauchy generator is used because ISA-L's
Vandermonde one is not MDS for every survivor set (NOTES: EC6P6 fails 8 of 924 sets).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

import numpy as np

from blobstore_server.libs.ec.errors import UnknownBackend
from blobstore_server.libs.ec.gf256 import gf_matmul

_u8p = ctypes.POINTER(ctypes.c_ubyte)
_PTRS = ctypes.POINTER(ctypes.c_void_p)
# The instance type of `_u8p`, for annotations (`_u8p` itself is a runtime value, not a type).
_U8Ptr: TypeAlias = "ctypes._Pointer[ctypes.c_ubyte]"


def _library_path() -> str:
    """Debian's libisal.so.2 when installed, else the copy bundled in the pyeclib wheel."""
    system = ctypes.util.find_library("isal")
    if system:
        return system
    spec = importlib.util.find_spec("pyeclib")
    if spec is not None and spec.submodule_search_locations:
        libs = Path(next(iter(spec.submodule_search_locations))).parent / "pyeclib.libs"
        for candidate in sorted(libs.glob("libisal*.so*")):
            return str(candidate)
    raise UnknownBackend("isal backend: libisal not found (install Debian libisal2 or the pyeclib wheel)")


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(_library_path())
    lib.gf_gen_cauchy1_matrix.argtypes = [_u8p, ctypes.c_int, ctypes.c_int]
    lib.gf_gen_cauchy1_matrix.restype = None
    lib.gf_invert_matrix.argtypes = [_u8p, _u8p, ctypes.c_int]
    lib.gf_invert_matrix.restype = ctypes.c_int
    lib.ec_init_tables.argtypes = [ctypes.c_int, ctypes.c_int, _u8p, _u8p]
    lib.ec_init_tables.restype = None
    lib.ec_encode_data.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, _u8p, _PTRS, _PTRS]
    lib.ec_encode_data.restype = None
    lib.gf_mul.argtypes = [ctypes.c_ubyte, ctypes.c_ubyte]
    lib.gf_mul.restype = ctypes.c_ubyte
    return lib


def library_path() -> str:
    """Where the ISA-L shared object was loaded from (for logs and bench reports)."""
    return _lib()._name


def _ptr(a: np.ndarray) -> _U8Ptr:
    return a.ctypes.data_as(_u8p)


def _addrs(arrays: Sequence[np.ndarray]) -> ctypes.Array[ctypes.c_void_p]:
    return (ctypes.c_void_p * len(arrays))(*(a.__array_interface__["data"][0] for a in arrays))


def _init_tables(k: int, coeffs: np.ndarray) -> np.ndarray:
    rows = coeffs.shape[0]
    tables = np.empty(32 * k * rows, dtype=np.uint8)
    _lib().ec_init_tables(k, rows, _ptr(np.ascontiguousarray(coeffs)), _ptr(tables))
    return tables


class IsalRS:
    """Systematic RS(N, M) with ISA-L's Cauchy generator; encode and rebuild into caller buffers."""

    name = "isal"

    def __init__(self, n: int, m: int) -> None:
        self.n, self.m = n, m
        matrix = np.empty((n + m, n), dtype=np.uint8)
        _lib().gf_gen_cauchy1_matrix(_ptr(matrix), n + m, n)
        self._matrix = matrix
        self._encode_tables = _init_tables(n, matrix[n:])
        # Decode tables depend on which shards survive and which are wanted: cache the few in use.
        self._decode_tables = functools.lru_cache(maxsize=256)(self._build_decode_tables)

    def encode_into(self, data: Sequence[np.ndarray], parity: Sequence[np.ndarray]) -> None:
        """Write the M parity shards of N equal-length data shards (GIL released by ctypes)."""
        _lib().ec_encode_data(
            len(data[0]), self.n, self.m, _ptr(self._encode_tables), _addrs(data), _addrs(parity)
        )

    def rebuild_into(self, present: Mapping[int, np.ndarray], wanted: Sequence[int],
                     out: Sequence[np.ndarray]) -> None:
        """Compute global shards `wanted` into `out` from at least N present global shards."""
        sources = tuple(sorted(present)[: self.n])
        tables = self._decode_tables(sources, tuple(wanted))
        _lib().ec_encode_data(
            len(out[0]), self.n, len(wanted), _ptr(tables),
            _addrs([present[i] for i in sources]), _addrs(out),
        )

    def _build_decode_tables(self, sources: tuple[int, ...], wanted: tuple[int, ...]) -> np.ndarray:
        sub = np.ascontiguousarray(self._matrix[list(sources)])
        inverse = np.empty_like(sub)
        if _lib().gf_invert_matrix(_ptr(sub), _ptr(inverse), self.n) != 0:
            raise ArithmeticError(f"singular survivor matrix {sources}: generator is not MDS")
        # Row w of the generator times the inverse maps the N sources to shard w.
        return _init_tables(self.n, gf_matmul(self._matrix[list(wanted)], inverse))
