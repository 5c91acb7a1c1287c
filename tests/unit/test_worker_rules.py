from __future__ import annotations

from itertools import product

import pytest

from blobstore_server.libs.proto.blobnode import ShardState
from blobstore_server.services.worker.config import WorkerConfig
from blobstore_server.services.worker.rules import LeaseDeadline, LeaseLapsed, RepairPlan, plan_repair

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


def test_the_local_deadline_counts_from_the_last_renewal_sent_and_keeps_a_margin() -> None:
    lease = LeaseDeadline(ttl=10.0, margin=2.0, since=100.0)
    assert lease.deadline == 108.0
    lease.check(107.99)
    with pytest.raises(LeaseLapsed, match=r"in the last 8\.0 s \(10 s lease, 2 s kept in hand\)"):
        lease.check(108.0)
    lease.renewed(105.0)
    lease.check(112.9)
    lease.renewed(103.0)  # an older renewal's answer, arriving late, moves nothing back
    assert lease.deadline == 113.0


def test_one_lost_renewal_is_ridden_out_two_in_a_row_are_not() -> None:
    """With the default margin, a task survives one renewal that does not go through (a scheduler changing hands,
    a slow answer), and is given up during the second."""
    ttl = 10.0
    margin = ttl * WorkerConfig.model_fields["lease_margin"].default
    lease = LeaseDeadline(ttl, margin, since=0.0)
    every = lease.renew_interval
    lease.check(2 * every)  # the first renewal lost: the second is sent in time
    lease.renewed(2 * every)
    lease.check(4 * every)  # the third lost; the fourth too:
    with pytest.raises(LeaseLapsed):
        lease.check(5 * every)
