from __future__ import annotations

import itertools

from blobstore_server.libs.proto.blobnode import ShardState
from blobstore_server.libs.proto.clustermgr import UNDELETE_MARGIN
from blobstore_server.services.tinker.rules import RetryPolicy, UploadVerdict, delete_due, taken_back, upload_verdict


def test_backoff_doubles_and_caps() -> None:
    policy = RetryPolicy(base=1, cap=10)
    assert [policy.backoff(r) for r in (1, 2, 3, 4, 5, 50)] == [1, 2, 4, 8, 10, 10]


def test_delete_waits_out_the_safe_delay_and_the_marks_granularity() -> None:
    # blobnodes keep a mark's time in whole seconds and hold from that second's end: tinker waits 1 s more
    assert delete_due(100.0, 30.0, now=110.0) == 21.0
    assert delete_due(100.0, 30.0, now=130.5) == 0.5
    assert delete_due(100.0, 30.0, now=131.0) == 0.0
    assert delete_due(100.0, 0.0, now=100.0) == 0.0  # no delay: at once, as the blobnodes' zero hold


def test_an_undelete_takes_back_the_deletes_stamped_before_it_and_no_later_one() -> None:
    assert not taken_back(100.0, None)  # no undelete kept: the delete stands
    assert taken_back(100.0, 100.0) and taken_back(50.0, 100.0)  # issued before it
    # mqproxy's clock may run ahead of clustermgr's by the margin: a delete stamped just after is taken back too
    assert taken_back(100.0 + UNDELETE_MARGIN, 100.0)
    assert not taken_back(100.0 + UNDELETE_MARGIN + 0.001, 100.0)  # a DELETE sent again afterwards stands
    assert not taken_back(110.0, 100.0, margin=0.0) and taken_back(100.0, 100.0, margin=0.0)


def _brute_verdict(blobs: list[tuple[ShardState, ...]], n: int) -> UploadVerdict:
    """Every way the silent shards could really be: finished if each blob reads back in all of them,
    unfinished if some blob cannot in any of them, else unknown."""
    silent = (ShardState.UNREACHABLE, ShardState.ERROR, ShardState.MOVED)
    low = all(sum(s is ShardState.PRESENT for s in b) >= n for b in blobs)
    high = all(sum(s is ShardState.PRESENT or s in silent for s in b) >= n for b in blobs)
    return UploadVerdict.FINISHED if low else UploadVerdict.UNKNOWN if high else UploadVerdict.UNFINISHED


def test_an_upload_is_finished_only_when_every_blob_reads_back() -> None:
    states = list(ShardState)
    for one in itertools.product(states, repeat=3):
        for two in itertools.product([ShardState.PRESENT, ShardState.MISSING, ShardState.UNREACHABLE], repeat=3):
            blobs = [one, two]
            assert upload_verdict(blobs, 2) is _brute_verdict(blobs, 2), blobs


def test_upload_verdicts_by_example() -> None:
    P, M, U, D = ShardState.PRESENT, ShardState.MISSING, ShardState.UNREACHABLE, ShardState.DELETED
    assert upload_verdict([[P, P, M], [P, P, P]], 2) is UploadVerdict.FINISHED
    assert upload_verdict([[P, P, P], [M, M, M]], 2) is UploadVerdict.UNFINISHED  # a part never uploaded
    assert upload_verdict([[P, U, U], [P, P, P]], 2) is UploadVerdict.UNKNOWN  # ask again later
    assert upload_verdict([[D, D, D]], 2) is UploadVerdict.UNFINISHED  # deleted meanwhile: reclaim is harmless
    assert upload_verdict([], 2) is UploadVerdict.FINISHED
