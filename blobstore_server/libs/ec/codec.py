"""Stripe a blob into N+M+L shards, and get the data or lost shards back from survivors.

Global parity comes from the RS backend; LRC local parity is the XOR of the other members of its
local stripe, computed here with numpy so both backends share it. Repair prefers the local stripe
(reads one AZ) and falls back to the global code.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

import numpy as np

from blobstore_server.libs import buffers  # noqa: F401  (importing it tunes malloc for multi-MiB stripes)
from blobstore_server.libs.ec.backends import DEFAULT_BACKEND, rs_backend
from blobstore_server.libs.ec.codemode import MAX_BLOB_SIZE, CodeMode, Tactic, tactic
from blobstore_server.libs.ec.errors import (
    BackendMismatch,
    BlobTooLarge,
    ECError,
    NotEnoughShards,
    ShardCountMismatch,
    ShardSizeMismatch,
)

Buffer = bytes | bytearray | memoryview


def _xor_into(out: np.ndarray, sources: Sequence[np.ndarray]) -> None:
    np.bitwise_xor(sources[0], sources[1], out=out)
    for src in sources[2:]:
        np.bitwise_xor(out, src, out=out)


def _immutable(data: object) -> bool:
    """Input that may back data shards without a copy (nobody can change it under us)."""
    return isinstance(data, bytes) or (isinstance(data, memoryview) and isinstance(data.obj, bytes))


class Codec:
    """Encoder/decoder for one code mode and backend; stateless between calls, safe across threads."""

    def __init__(self, mode: CodeMode, backend: str = DEFAULT_BACKEND) -> None:
        self.mode = mode
        self.tactic: Tactic = tactic(self.mode)
        self._rs = rs_backend(backend, self.tactic.n, self.tactic.m)
        self.backend: str = self._rs.name
        self._stripe_of = {i: stripe for stripe in self.tactic.local_stripes() for i in stripe}

    def __repr__(self) -> str:
        return f"Codec({self.mode.name}, backend={self.backend!r})"

    def encode(self, data: Buffer) -> list[memoryview]:
        """Return N+M+L equal-length shards; data shards may be views of an immutable `data`."""
        t = self.tactic
        src = np.frombuffer(data, dtype=np.uint8)
        size = src.size
        if size > MAX_BLOB_SIZE:
            raise BlobTooLarge(f"blob of {size} bytes exceeds the {MAX_BLOB_SIZE}-byte maximum")
        s = t.shard_size(size)
        shared = min(size // s, t.n) if _immutable(data) else 0
        own = np.empty((t.total - shared) * s, dtype=np.uint8)
        tail = size - shared * s
        own[:tail] = src[shared * s :]
        own[tail : (t.n - shared) * s] = 0
        shards = [src[i * s : (i + 1) * s] for i in range(shared)]
        shards += [own[j * s : (j + 1) * s] for j in range(t.total - shared)]
        self._rs.encode_into(shards[: t.n], shards[t.n : t.global_count])
        for stripe in t.local_stripes():
            _xor_into(shards[stripe[-1]], [shards[i] for i in stripe[:-1]])
        # `ndarray.data` is `memoryview(a)` (same zero-copy buffer); numpy's stubs only declare
        # `__buffer__` for Python >= 3.12, so mypy (targeting 3.11) rejects `memoryview(a)`.
        return [a.data for a in shards]

    def decode(self, shards: Sequence[Buffer | None], size: int, encoded_with: str | None = None) -> bytes:
        """Return the original `size` bytes, rebuilding only the data shards that hold them."""
        if not 0 <= size <= MAX_BLOB_SIZE:
            raise BlobTooLarge(f"blob size {size} is outside 0..{MAX_BLOB_SIZE}")
        arrays, length = self._check(shards, encoded_with)
        s = self.tactic.shard_size(size)
        if length is not None and length != s:
            raise ShardSizeMismatch(
                f"{self.mode.name}: shards are {length} bytes but a {size}-byte blob has {s}-byte shards"
            )
        count = -(-size // s)
        missing = [i for i in range(count) if arrays[i] is None]
        rebuilt = self._recover(arrays, missing, s) if missing else {}
        parts = []
        for i in range(count):
            shard = arrays[i]
            if shard is None:
                shard = rebuilt[i]
            parts.append(shard[: min(s, size - i * s)].data)
        return b"".join(parts)

    def reconstruct(self, shards: Sequence[Buffer | None], wanted_indexes: Iterable[int],
                    encoded_with: str | None = None) -> dict[int, memoryview]:
        """Rebuild the wanted shards (their passed contents, if any, are ignored as suspect)."""
        arrays, length = self._check(shards, encoded_with)
        wanted = sorted(set(wanted_indexes))
        bad = [w for w in wanted if not 0 <= w < self.tactic.total]
        if bad:
            raise ECError(f"{self.mode.name}: shard indexes {bad} outside 0..{self.tactic.total - 1}")
        for w in wanted:
            arrays[w] = None
        sizes = {a.size for a in arrays if a is not None}
        if length is None or not sizes:
            raise self._not_enough(0, 0)
        return {w: a.data for w, a in self._recover(arrays, wanted, sizes.pop()).items()}

    def _check(self, shards: Sequence[Buffer | None],
               encoded_with: str | None) -> tuple[list[np.ndarray | None], int | None]:
        if encoded_with is not None and encoded_with != self.backend:
            raise BackendMismatch(
                f"shards were encoded with backend {encoded_with!r} but this codec uses {self.backend!r}; "
                f"build Codec({self.mode.name}, backend={encoded_with!r})"
            )
        if len(shards) != self.tactic.total:
            raise ShardCountMismatch(
                f"{self.mode.name} has {self.tactic.total} shards per stripe, got {len(shards)}"
            )
        arrays = [None if x is None else np.frombuffer(x, dtype=np.uint8) for x in shards]
        lengths = sorted({a.size for a in arrays if a is not None})
        if len(lengths) > 1:
            raise ShardSizeMismatch(f"{self.mode.name}: shards of one stripe differ in length: {lengths}")
        return arrays, (lengths[0] if lengths else None)

    def _not_enough(self, present: int, usable: int) -> NotEnoughShards:
        t = self.tactic
        if t.is_lrc:
            msg = (f"{self.mode.name}: {present} of {t.total} shards present, {usable} of the "
                   f"{t.global_count} global shards usable after local repair, need {t.n}")
        else:
            msg = f"{self.mode.name}: {present} of {t.total} shards present, need {t.n} (at most {t.m} lost)"
        return NotEnoughShards(msg, present=present, needed=t.n)

    def _recover(self, arrays: list[np.ndarray | None], wanted: list[int], s: int) -> dict[int, np.ndarray]:
        """Shards `wanted` (all None in `arrays`): local stripe first, then the global code."""
        t = self.tactic
        present = {i: a for i, a in enumerate(arrays) if a is not None}
        n_present = len(present)
        out = np.empty(len(wanted) * s, dtype=np.uint8)
        result = {w: out[k * s : (k + 1) * s] for k, w in enumerate(wanted)}
        remaining = []
        for w in wanted:
            others = [i for i in self._stripe_of.get(w, ()) if i != w]
            if others and all(i in present for i in others):
                _xor_into(result[w], [present[i] for i in others])
            else:
                remaining.append(w)
        if not remaining:
            return result
        present.update((w, result[w]) for w in wanted if w not in remaining)
        self._peel(present, s)
        usable = {i: a for i, a in present.items() if i < t.global_count}
        if len(usable) < t.n:
            raise self._not_enough(n_present, len(usable))
        local_wanted = [w for w in remaining if w >= t.global_count]
        needed = sorted(
            {w for w in remaining if w < t.global_count}
            | {i for w in local_wanted for i in self._stripe_of[w][:-1] if i not in usable}
        )
        if needed:
            targets = [result[i] if i in result else np.empty(s, dtype=np.uint8) for i in needed]
            self._rs.rebuild_into(usable, needed, targets)
            usable.update(zip(needed, targets, strict=True))
        for w in local_wanted:
            _xor_into(result[w], [usable[i] for i in self._stripe_of[w][:-1]])
        return result

    def _peel(self, present: dict[int, np.ndarray], s: int) -> None:
        """Repair single losses inside local stripes until the global code has N shards to work with."""
        t = self.tactic
        for stripe in t.local_stripes():
            if sum(i < t.global_count for i in present) >= t.n:
                return
            lost = [i for i in stripe if i not in present]
            if len(lost) == 1 and lost[0] < t.global_count:
                shard = np.empty(s, dtype=np.uint8)
                _xor_into(shard, [present[i] for i in stripe if i != lost[0]])
                present[lost[0]] = shard


@functools.cache
def codec_for(mode: CodeMode, backend: str = DEFAULT_BACKEND) -> Codec:
    """The one shared codec per (mode, backend): its tables are built once per process."""
    return Codec(mode, backend)
