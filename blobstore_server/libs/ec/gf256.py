"""GF(2^8) arithmetic for small coefficient matrices (polynomial 0x11d, the one ISA-L and zfec use)."""

from __future__ import annotations

import numpy as np


def _mul_table() -> np.ndarray:
    exp = np.zeros(512, dtype=np.int64)
    log = np.zeros(256, dtype=np.int64)
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= 0x11D
    exp[255:510] = exp[:255]
    table = exp[log[:, None] + log[None, :]].astype(np.uint8)
    table[0, :] = 0
    table[:, 0] = 0
    return table


MUL = _mul_table()


def gf_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Matrix product over GF(2^8): sums are XOR, products come from the table."""
    products = MUL[a[:, :, None], b[None, :, :]]
    return np.bitwise_xor.reduce(products, axis=1).astype(np.uint8)
