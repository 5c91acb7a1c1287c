"""The linearizability checker of the partition tests (tests/support/linearizable.py) on histories whose answer
is known, the bad ones being the anomalies Jepsen found in real systems (stale reads from a deposed leader, two
winners of one CAS, a read of a value never written)."""

from __future__ import annotations

import random

from tests.support.linearizable import Op, check


def get(call: float, ret: float | None, result: str | None, key: str = "k") -> Op:
    return Op("get", key, call, ret, result=result)


def put(call: float, ret: float | None, value: str, key: str = "k") -> Op:
    return Op("set", key, call, ret, value=value)


def cas(call: float, ret: float | None, expected: str | None, value: str, result: bool | None, key: str = "k") -> Op:
    return Op("cas", key, call, ret, value=value, expected=expected, result=result)


def test_sequential_and_overlapping_histories_that_have_an_order() -> None:
    assert check([put(0, 1, "a"), get(2, 3, "a"), cas(4, 5, "a", "b", True), get(6, 7, "b")]) == []
    # a read overlapping a write may see either value, and two overlapping reads may disagree in time order
    assert check([put(0, 10, "a"), get(1, 2, None), get(3, 4, "a"), get(5, 6, "a")]) == []
    assert check([cas(0, 5, None, "x", True), cas(1, 6, None, "y", False), get(7, 8, "x")]) == []


def test_a_stale_read_after_an_acknowledged_write_is_caught() -> None:
    """etcd 0.4 / Consul: the old leader answers from its own state after the new one committed."""
    assert check([put(0, 1, "a"), put(2, 3, "b"), get(4, 5, "a")]) == ["k"]


def test_two_winners_of_one_cas_are_caught() -> None:
    assert check([put(0, 1, "v0"), cas(2, 5, "v0", "p", True), cas(3, 6, "v0", "q", True)]) == ["k"]


def test_a_read_of_a_value_never_written_is_caught() -> None:
    assert check([put(0, 1, "a"), get(2, 3, "z")]) == ["k"]


def test_an_unanswered_write_may_have_happened_or_not() -> None:
    seen = [put(0, 1, "a"), put(2, None, "b"), get(10, 11, "b")]  # timed out, yet took effect
    lost = [put(0, 1, "a"), put(2, None, "b"), get(10, 11, "a"), get(12, 13, "a")]  # timed out, never applied
    late = [put(0, 1, "a"), put(2, None, "b"), get(10, 11, "a"), get(12, 13, "b")]  # applied late
    flip = [put(0, 1, "a"), put(2, None, "b"), get(10, 11, "b"), get(12, 13, "a")]  # b then a again: impossible
    assert check(seen) == [] and check(lost) == [] and check(late) == []
    assert check(flip) == ["k"]


def test_keys_are_judged_apart() -> None:
    history = [put(0, 1, "a", key="x"), get(2, 3, "a", key="x"), put(0, 1, "b", key="y"), get(2, 3, "c", key="y")]
    assert check(history) == ["y"]
    assert check([get(0, 1, "seed", key="z")], initial={"z": "seed"}) == []


def test_a_random_sequential_history_of_many_clients_is_linearizable_and_one_corruption_is_not() -> None:
    """A serial execution of 300 operations by 6 clients, answered with some overlap: linearizable by
    construction; changing one read's answer to a value that key never had makes it not."""
    rng = random.Random(7)
    state: dict[str, str | None] = {"a": None, "b": None}
    history: list[Op] = []
    now = 0.0
    for n in range(300):
        key = rng.choice("ab")
        call, ret = now, now + rng.uniform(0.5, 3.0)  # overlaps the next operations
        kind = rng.choice(["get", "set", "cas"])
        if kind == "get":
            history.append(get(call, ret, state[key], key))
        elif kind == "set":
            state[key] = f"v{n}"
            history.append(put(call, ret, f"v{n}", key))
        else:
            expected = state[key] if rng.random() < 0.5 else "nope"
            swapped = state[key] == expected
            if swapped:
                state[key] = f"v{n}"
            history.append(cas(call, ret, expected, f"v{n}", swapped, key))
        now += 1.0
    assert check(history) == []
    reads = [i for i, op in enumerate(history) if op.kind == "get" and op.call > 100]
    bad = history[reads[0]]
    history[reads[0]] = get(bad.call, bad.ret, "never", bad.key)
    assert check(history) == [bad.key]
