"""Registry of Reed-Solomon backends for the global N+M stripe.

The backend name is part of a volume's identity: parity from different backends differs, so a
volume records the name it was written with and reads build the codec with that name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from blobstore_server.libs.ec.errors import UnknownBackend

if TYPE_CHECKING:
    import numpy as np

DEFAULT_BACKEND = "isal"
BACKENDS = ("isal", "zfec")


class RSBackend(Protocol):
    """Systematic RS(N, M): data shards 0..N-1, parity N..N+M-1, all equal length."""

    name: str

    def encode_into(self, data: Sequence[np.ndarray], parity: Sequence[np.ndarray]) -> None: ...

    def rebuild_into(self, present: Mapping[int, np.ndarray], wanted: Sequence[int],
                     out: Sequence[np.ndarray]) -> None: ...


@functools.cache
def rs_backend(name: str, n: int, m: int) -> RSBackend:
    """One shared (thread-safe, read-only tables) backend per (name, N, M)."""
    if name == "isal":
        from blobstore_server.libs.ec.isal import IsalRS

        return IsalRS(n, m)
    if name == "zfec":
        from blobstore_server.libs.ec.zfec_backend import ZfecRS

        return ZfecRS(n, m)
    raise UnknownBackend(f"unknown EC backend {name!r}; supported: {', '.join(BACKENDS)}")
