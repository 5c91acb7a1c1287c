"""Where a blobnode may write the inspection's exports: only under its configured roots."""

from __future__ import annotations

import pytest

from blobstore_server.libs.proto.export import open_target, spark_path
from blobstore_server.libs.rpc.errors import BadRequest
from blobstore_server.services.blobnode.node import export_allowed

ROOTS = ["/srv/cluster", "s3://bucket/inspect"]


@pytest.mark.parametrize(("target", "allowed"), [
    ("/srv/cluster", True), ("/srv/cluster/inspect/run1", True), ("file:///srv/cluster/x", True),
    ("s3://bucket/inspect/2026", True), ("/srv/cluster/a/../b", True),
    ("/srv/cluster/../etc", False), ("/srv/clusterx/a", False), ("/etc/cron.d", False),
    ("s3://bucket/other", False), ("s3://evil/inspect/x", False), ("hdfs://bucket/inspect/x", False),
    ("s3://bucket/inspect/../other", False),
])
def test_exports_go_only_under_a_root(target: str, allowed: bool) -> None:
    assert export_allowed(target, ROOTS) is allowed


def test_no_root_refuses_every_export() -> None:
    assert not export_allowed("/srv/cluster", [])


def test_an_s3_target_needs_the_user_it_is_written_as_and_spark_reads_it_as_s3a() -> None:
    with pytest.raises(BadRequest, match="no S3 endpoint"):
        open_target("s3://bucket/inspect")
    assert spark_path("s3://bucket/inspect/", "findings") == "s3a://bucket/inspect/findings"
    assert spark_path("/srv/cluster/inspect", "findings") == "/srv/cluster/inspect/findings"
    assert spark_path("s3://bucket/inspect") == "s3a://bucket/inspect"
