from __future__ import annotations

from itertools import product

import pytest

from blobstore_server.libs.proto.blobnode import ShardState
from blobstore_server.services.worker.rules import RepairPlan, plan_repair

P, M, C, D, U = (ShardState.PRESENT, ShardState.MISSING, ShardState.CORRUPT, ShardState.DELETED,
                 ShardState.UNREACHABLE)


def test_rebuilds_the_reported_shards_and_any_survivor_found_gone_or_corrupt() -> None:
    assert plan_repair({0}, [P, M, P, C, U, P]) == RepairPlan(rebuild=(0, 1, 3), sources=(2, 5))


def test_never_writes_a_blob_that_is_being_deleted_or_has_no_shard_left() -> None:
    assert plan_repair({0}, [P, P, D, P, P, P]).skip == "the blob is being deleted"
    assert plan_repair({0, 1}, [P, M, M, M, M, M]).skip == "no shard of the blob exists"


def test_every_combination_of_three_shards_keeps_the_rules() -> None:
    states = [P, M, C, D, U]
    for combo in product(states, repeat=3):
        plan = plan_repair({0}, list(combo))
        if D in combo:
            assert plan.skip and not plan.rebuild
        elif all(s is M for s in combo[1:]):
            assert plan.skip == "no shard of the blob exists"
        else:
            assert not plan.skip and 0 in plan.rebuild
            assert all(combo[i] is P for i in plan.sources) and 0 not in plan.sources
            assert not set(plan.rebuild) & set(plan.sources)
            assert all(combo[i] is not U for i in plan.rebuild if i != 0)  # unreachable is not ours to judge


def test_a_shard_index_outside_the_volume_is_refused() -> None:
    with pytest.raises(ValueError, match="no shard index"):
        plan_repair({7}, [P] * 6)
