"""A linearizability checker for histories of get/set/CAS on a key-value store (Wing & Gong's search with Lowe's
memoization, as Knossos and porcupine do it), used by the partition tests on clustermgr's kv.

Keys are independent registers, so each key's sub-history is checked on its own (linearizability is local).
An operation whose outcome the client never learned (timeout, connection cut: `ret` None) may have taken effect
at any moment after its call, or never: the search may place it anywhere after its call or leave it out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Value = str | None  # None: the key is absent


@dataclass(frozen=True)
class Op:
    """One client operation: `get` read `result`; `set` wrote `value`; `cas` swapped `expected` for `value` and
    answered `result` (True: swapped, False: refused). `call`/`ret` are times on one clock (ret None: unknown)."""

    kind: str
    key: str
    call: float
    ret: float | None
    value: Value = None
    expected: Value = None
    result: Value | bool = None


def _step(state: Value, op: Op) -> tuple[bool, Value]:
    """Whether `op` may take effect on `state` as observed, and the state after it."""
    if op.kind == "get":
        return op.result == state, state
    if op.kind == "set":
        return True, op.value
    if op.kind == "cas":
        if op.ret is None:  # outcome unknown: if it happened here, it swapped exactly when it matched
            return True, op.value if state == op.expected else state
        if op.result is True:
            return state == op.expected, op.value
        return state != op.expected, state
    raise ValueError(f"unknown operation {op.kind!r}")


def _linearizable_key(ops: Sequence[Op], initial: Value) -> bool:
    ops = [op for op in ops if not (op.kind == "get" and op.ret is None)]  # an unanswered read tells nothing
    ops.sort(key=lambda op: op.call)
    must = 0  # bitmask of the operations that took effect for sure (answered)
    for i, op in enumerate(ops):
        if op.ret is not None:
            must |= 1 << i
    seen: set[tuple[int, Value]] = set()
    stack: list[tuple[int, Value]] = [(0, initial)]
    while stack:
        done, state = stack.pop()
        if done & must == must:
            return True
        if (done, state) in seen:
            continue
        seen.add((done, state))
        # The next to take effect must have been called before every pending answered one returned.
        horizon = min(op.ret for i, op in enumerate(ops) if not done >> i & 1 and op.ret is not None)
        for i, op in enumerate(ops):
            if done >> i & 1 or op.call > horizon:
                continue
            ok, after = _step(state, op)
            if ok:
                stack.append((done | 1 << i, after))
    return False


def check(history: Iterable[Op], initial: dict[str, Value] | None = None) -> list[str]:
    """The keys whose sub-history is not linearizable (empty: the whole history is)."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    start = initial or {}
    return sorted(key for key, ops in by_key.items() if not _linearizable_key(ops, start.get(key)))
