from __future__ import annotations

from functools import cache
from itertools import combinations

import pytest

from blobstore_server.libs.ec import Codec, CodeMode, Tactic, tactic
from blobstore_server.libs.proto.blobnode import ShardState
from blobstore_server.libs.rpc.errors import NotFound, Unavailable
from blobstore_server.services.access.quorum import Written, decide_put, unreadable

MODES = [CodeMode.EC3P3, CodeMode.EC6P3, CodeMode.EC6P6, CodeMode.EC4P4L2, CodeMode.EC6P3L3]

# Written out by hand from the |data|parity|local| layout, not computed with `Tactic.unit_az`.
AZS: dict[CodeMode, list[set[int]]] = {
    CodeMode.EC6P6: [{0, 1, 6, 7}, {2, 3, 8, 9}, {4, 5, 10, 11}],
    CodeMode.EC6P3L3: [{0, 1, 6, 9}, {2, 3, 7, 10}, {4, 5, 8, 11}],
}


def subsets(total: int) -> list[frozenset[int]]:
    return [frozenset(i for i in range(total) if mask >> i & 1) for mask in range(1 << total)]


@cache
def expected_ok(mode: CodeMode, written: frozenset[int]) -> bool:
    t = tactic(mode)
    if len(written) >= t.put_quorum:
        return True
    return any(set(range(t.total)) - az <= written for az in AZS.get(mode, []))


def ok(t: Tactic, written: Written) -> bool:
    return decide_put(t, written).ok


@cache
def stripe(mode: CodeMode) -> tuple[bytes, list[bytes]]:
    data = bytes(i * 7 % 251 for i in range(tactic(mode).n * 2048 - 5))
    return data, [bytes(s) for s in Codec(mode).encode(data)]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_every_subset_of_written_shards(mode: CodeMode) -> None:
    t = tactic(mode)
    data, shards = stripe(mode)
    codec = Codec(mode)
    for written in subsets(t.total):
        decision = decide_put(t, written)
        assert decision.ok == expected_ok(mode, written), (sorted(written), decision)
        assert decision.missing == tuple(sorted(set(range(t.total)) - written))
        as_bools = [i in written for i in range(t.total)]
        assert ok(t, as_bools) == ok(t, set(written)) == decision.ok
        if not decision.ok:
            continue
        # Safety, independent of the rule: the written shards alone rebuild the blob.
        assert len(written & set(range(t.global_count))) >= t.n
        assert codec.decode([s if i in written else None for i, s in enumerate(shards)], len(data)) == data
        # Writing more never turns a success into a failure.
        assert all(ok(t, written | {extra}) for extra in set(range(t.total)) - written)


def test_ec6p6_with_one_az_down_succeeds_only_when_the_other_two_azs_hold_all_8_shards() -> None:
    t = tactic(CodeMode.EC6P6)
    everything = set(range(t.total))
    for down in AZS[CodeMode.EC6P6]:
        survivors = everything - down
        assert len(survivors) == 8
        decision = decide_put(t, survivors)
        assert decision.ok and "down" in decision.reason
        assert decision.missing == tuple(sorted(down))
        for lost in survivors:  # one more miss outside the down AZ: below quorum and spread over two AZs
            assert not ok(t, survivors - {lost})
    for written in subsets(t.total):
        if ok(t, written) and len(written) < t.put_quorum:
            assert any(everything - az <= written for az in AZS[CodeMode.EC6P6])


def test_single_az_modes_follow_the_quorum_alone() -> None:
    t = tactic(CodeMode.EC3P3)
    assert ok(t, {0, 1, 2, 3, 4})
    assert not ok(t, {0, 1, 2, 3})
    for written in combinations(range(t.total), t.put_quorum - 1):
        assert not ok(t, set(written))
    t = tactic(CodeMode.EC4P4L2)  # two AZs: losing one would leave too little, so no AZ fallback
    assert not ok(t, {0, 1, 4, 5, 8})


def test_failure_reason_names_counts_and_azs() -> None:
    decision = decide_put(tactic(CodeMode.EC6P6), {0, 1, 2, 3, 4, 5, 6, 7, 8})
    assert not decision.ok
    assert decision.reason == "9 of 12 shards written, quorum is 11; the missing shards span AZs [1, 2]"
    assert decide_put(tactic(CodeMode.EC3P3), set()).reason == "0 of 6 shards written, quorum is 5"


@pytest.mark.parametrize("written", [{6}, {-1}, {"0"}, [True] * 5, [True] * 7, [1, 1, 1, 1, 1, 1], (0, 1, 2, 3, 4, 5)])
def test_malformed_written_is_refused(written: object) -> None:
    with pytest.raises(ValueError):
        ok(tactic(CodeMode.EC3P3), written)  # type: ignore[arg-type]


def test_an_unreadable_blob_is_deleted_only_when_a_shard_says_so_or_too_many_are_gone() -> None:
    t = tactic(CodeMode.EC6P3)
    assert isinstance(unreadable(t, 1, 2, {0: ShardState.DELETED}, 8), NotFound)
    assert isinstance(unreadable(t, 1, 2, dict.fromkeys(range(4), ShardState.MISSING), 5), NotFound)
    three_missing = unreadable(t, 1, 2, dict.fromkeys(range(3), ShardState.MISSING), 5)
    assert isinstance(three_missing, Unavailable) and not isinstance(three_missing, NotFound)
    down = unreadable(t, 1, 2, dict.fromkeys(range(6), ShardState.UNREACHABLE), 3)
    assert isinstance(down, Unavailable) and "3 shards readable, 6 needed" in down.message
