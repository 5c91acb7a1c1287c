"""What an undelete answers, from the states of each blob's shards once their marks were lifted."""

from __future__ import annotations

import itertools

from blobstore_server.libs.proto.blobnode import ShardState
from blobstore_server.services.access.undelete import SILENT, Restore, restore_verdict

P, M, C, U, E = ShardState.PRESENT, ShardState.MISSING, ShardState.CORRUPT, ShardState.UNREACHABLE, ShardState.ERROR


def _brute(states: tuple[ShardState, ...], n: int) -> Restore:
    """Every way the silent shards could really be: whole only if every shard answered present; readable if at least
    n answered present; gone if n cannot be present whatever the silent ones hold; else unknown."""
    present = states.count(P)
    if present == len(states):
        return Restore.WHOLE
    if present >= n:
        return Restore.DEGRADED
    return Restore.UNKNOWN if present + sum(s in SILENT for s in states) >= n else Restore.PURGED


def test_every_combination_of_four_shards_against_the_brute_force_answer() -> None:
    for states in itertools.product(list(ShardState), repeat=4):
        for n in (1, 2, 3, 4):
            assert restore_verdict(states, n) is _brute(states, n), (states, n)


def test_restore_verdicts_by_example() -> None:
    assert restore_verdict([P] * 6, 3) is Restore.WHOLE
    assert restore_verdict([P, P, P, M, C, P], 3) is Restore.DEGRADED  # decodes; the two are repaired
    assert restore_verdict([P, P, U, E, M, M], 3) is Restore.UNKNOWN  # two silent blobnodes could hold the third
    assert restore_verdict([P, P, M, M, M, M], 3) is Restore.PURGED  # the purge had passed the point of no return
    assert restore_verdict([M] * 6, 3) is Restore.PURGED
    # an object's answer is its worst blob's
    assert max([Restore.WHOLE, Restore.PURGED, Restore.UNKNOWN]) is Restore.PURGED
