"""Reed-Solomon over zfec 1.6, the second backend (systematic RS only; releases the GIL).

zfec returns freshly allocated blocks, so results are copied into the codec's buffers: one
extra copy of the shards produced, small next to zfec's own cost (~10x slower than ISA-L).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import zfec


class ZfecRS:
    """Systematic RS(N, M) with zfec's generator; parity is not interchangeable with ISA-L's."""

    name = "zfec"

    def __init__(self, n: int, m: int) -> None:
        self.n, self.m = n, m
        self._encoder = zfec.Encoder(n, n + m)
        self._decoder = zfec.Decoder(n, n + m)
        self._parity_nums = tuple(range(n, n + m))

    def encode_into(self, data: Sequence[np.ndarray], parity: Sequence[np.ndarray]) -> None:
        """Write the M parity shards of N equal-length data shards."""
        blocks = self._encoder.encode(tuple(data), self._parity_nums)
        for dst, src in zip(parity, blocks, strict=True):
            dst[:] = np.frombuffer(src, dtype=np.uint8)

    def rebuild_into(self, present: Mapping[int, np.ndarray], wanted: Sequence[int],
                     out: Sequence[np.ndarray]) -> None:
        """Compute global shards `wanted` into `out` from at least N present global shards."""
        sources = tuple(sorted(present)[: self.n])
        if all(i < self.n for i in sources):
            primary: Sequence[np.ndarray | bytes] = [present[i] for i in sources]
        else:
            primary = self._decoder.decode(tuple(present[i] for i in sources), sources)
        parity_wanted = tuple(w for w in wanted if w >= self.n)
        parity: dict[int, bytes] = {}
        if parity_wanted:
            blocks = self._encoder.encode(tuple(primary), parity_wanted)
            parity = dict(zip(parity_wanted, blocks, strict=True))
        for dst, w in zip(out, wanted, strict=True):
            dst[:] = np.frombuffer(parity[w] if w >= self.n else primary[w], dtype=np.uint8)
