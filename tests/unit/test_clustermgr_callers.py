"""What clustermgr lets a caller ask beyond its capability: scope counts, lease holders, disks declared empty."""

from __future__ import annotations

import pytest

from blobstore_server.libs.proto.cluster import DiskStatus
from blobstore_server.libs.rpc.auth import OPERATOR
from blobstore_server.libs.rpc.errors import BadRequest, Conflict, Forbidden
from blobstore_server.services.clustermgr.callers import (
    SCOPE_LIMITS,
    check_disk_move,
    check_holder,
    check_scope_request,
)


def test_only_bids_are_handed_out_and_at_most_the_limit_at_once() -> None:
    check_scope_request("bid", 10_000)
    check_scope_request("bid", SCOPE_LIMITS["bid"])
    with pytest.raises(BadRequest, match="at most"):
        check_scope_request("bid", SCOPE_LIMITS["bid"] + 1)
    for name in ("vid", "disk_id", "anything"):
        with pytest.raises(BadRequest, match="not handed out"):
            check_scope_request(name, 1)


def test_a_lease_names_its_signer_unless_the_operator_or_no_auth_sends_it() -> None:
    check_holder("http://alloc-a", "http://alloc-a")
    check_holder(OPERATOR, "http://alloc-a")
    check_holder(None, "alloc-a")  # auth off: the body names the holder
    with pytest.raises(Forbidden, match="own name"):
        check_holder("http://alloc-b", "http://alloc-a")


@pytest.mark.parametrize("current,wanted", [(DiskStatus.REPAIRING, DiskStatus.REPAIRED),
                                            (DiskStatus.DROPPING, DiskStatus.DROPPED)])
def test_a_disk_is_declared_emptied_only_once_no_unit_is_left(current: DiskStatus, wanted: DiskStatus) -> None:
    check_disk_move(1, current, wanted, units_left=0)
    check_disk_move(1, wanted, wanted, units_left=3)  # already there: nothing changes
    with pytest.raises(Conflict, match="3 volume units"):
        check_disk_move(1, current, wanted, units_left=3)
    for other in (DiskStatus.BROKEN, DiskStatus.REPAIRING, DiskStatus.NORMAL, None):
        check_disk_move(1, current, other, units_left=3)
