"""Every survivor set of the small modes, random ones of the large modes, both backends."""

import itertools
import math
import random
from collections.abc import Iterator

import pytest

from blobstore_server.libs.ec import BACKENDS, Codec, CodeMode, NotEnoughShards, Tactic


def recoverable(t: Tactic, lost: frozenset[int]) -> bool:
    """What global RS + XOR local parity rebuild: each local stripe repairs a single loss of its own,
    then the global stripe needs N of its N+M shards."""
    global_lost = {i for i in lost if i < t.n + t.m}
    for stripe in t.local_stripes():
        stripe_lost = [i for i in stripe if i in lost]
        if len(stripe_lost) == 1:
            global_lost.discard(stripe_lost[0])
    return t.n + t.m - len(global_lost) >= t.n


def loss_sets(t: Tactic) -> Iterator[frozenset[int]]:
    """Every loss set up to M+1 losses (the first that must fail); every subset for LRC modes."""
    most = t.total if t.is_lrc else t.m + 1
    for k in range(most + 1):
        for lost in itertools.combinations(range(t.total), k):
            yield frozenset(lost)


def check(codec: Codec, data: bytes, shards: list[bytes], lost: frozenset[int]) -> bool:
    survivors = [None if i in lost else s for i, s in enumerate(shards)]
    if not recoverable(codec.tactic, lost):
        with pytest.raises(NotEnoughShards):
            codec.reconstruct(survivors, sorted(lost))
        if any(i < codec.tactic.n for i in lost):
            with pytest.raises(NotEnoughShards):
                codec.decode(survivors, len(data))
        return False
    assert codec.decode(survivors, len(data)) == data, sorted(lost)
    if lost:
        rebuilt = codec.reconstruct(survivors, sorted(lost))
        assert all(bytes(rebuilt[i]) == shards[i] for i in lost), sorted(lost)
    return True


def encoded(codec: Codec, seed: object) -> tuple[bytes, list[bytes]]:
    """A blob just under N min-size shards: the smallest stripe, so exhaustive runs stay fast."""
    data = random.Random(str(seed)).randbytes(codec.tactic.n * codec.tactic.min_shard_size - 5)
    return data, [bytes(s) for s in codec.encode(data)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [CodeMode.EC3P3, CodeMode.EC6P3, CodeMode.EC6P6, CodeMode.EC4P4L2],
                         ids=lambda m: m.name)
def test_every_survivor_set(mode: CodeMode, backend: str) -> None:
    codec = Codec(mode, backend)
    t = codec.tactic
    data, shards = encoded(codec, mode)
    outcomes = {lost: check(codec, data, shards, lost) for lost in loss_sets(t)}
    within_m = sum(math.comb(t.total, k) for k in range(t.m + 1))
    assert all(ok for lost, ok in outcomes.items() if len(lost) <= t.m)
    if t.is_lrc:
        assert sum(outcomes.values()) > within_m  # local parity recovers some sets beyond M losses
    else:
        assert sum(outcomes.values()) == within_m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [CodeMode.EC10P4, CodeMode.EC12P4, CodeMode.EC16P4, CodeMode.EC15P12,
                                  CodeMode.EC6P10L2, CodeMode.EC16P20L2, CodeMode.EC6P3L3], ids=lambda m: m.name)
def test_random_survivor_sets(mode: CodeMode, backend: str) -> None:
    codec = Codec(mode, backend)
    t = codec.tactic
    data, shards = encoded(codec, mode)
    rng = random.Random(f"{mode}/{backend}")
    recovered = 0
    for _ in range(300):
        k = rng.randint(1, t.m + t.l + 1)
        recovered += check(codec, data, shards, frozenset(rng.sample(range(t.total), k)))
    assert recovered > 100
