"""clustermgr's figures read at scrape time: this replica's Raft position and the cluster's volumes and disks by
status."""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client.core import Metric

from blobstore_server.libs.proto.cluster import DiskStatus, VolumeStatus
from blobstore_server.libs.raft.output import Role
from blobstore_server.libs.rpc.metrics import counter, gauge
from blobstore_server.services.clustermgr.manager import ClusterManager


def cluster_figures(cm: ClusterManager) -> Iterator[Metric]:
    if cm.raft.core is None:  # not started yet
        return
    raft = cm.raft_status()
    yield gauge("blobstore_raft_term", "This replica's current Raft term", raft.term)
    yield gauge("blobstore_raft_role", "1 for this replica's Raft role",
                [((r.value,), float(raft.role == r.value)) for r in Role], ["role"])
    yield gauge("blobstore_raft_leader_id", "Node id of the leader this replica follows (0: none)", raft.leader or 0)
    yield gauge("blobstore_raft_commit_index", "Highest log index known committed", raft.commit)
    yield gauge("blobstore_raft_applied_index", "Highest log index applied to the state machine", raft.applied)
    yield gauge("blobstore_raft_last_index", "Last index in this replica's log", raft.last_index)
    yield counter("blobstore_raft_log_writes", "Synced writes to this replica's Raft log (one fsync each)",
                  raft.log_writes)
    yield gauge("blobstore_raft_members", "Members (voters and learners) in the configuration", len(raft.members))
    volumes = Tally(v.status for v in cm.state.volumes())
    disks = list(cm.state.disks())
    by_status = Tally(d.status for d in disks)
    yield gauge("blobstore_clustermgr_volumes", "Volumes by status",
                [((s.value,), volumes[s]) for s in VolumeStatus], ["status"])
    yield gauge("blobstore_clustermgr_disks", "Disks by status",
                [((s.value,), by_status[s]) for s in DiskStatus], ["status"])
    now, timeout = time.time(), cm.config.disk_heartbeat_timeout
    yield gauge("blobstore_clustermgr_disks_silent", "Disks whose blobnode missed its heartbeats",
                sum(now - d.last_heartbeat > timeout for d in disks))
