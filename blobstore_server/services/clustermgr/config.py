"""clustermgr configuration (`python -m blobstore_server.services.clustermgr -c clustermgr.json`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from blobstore_server.libs.ec import DEFAULT_BACKEND
from blobstore_server.libs.proto.clustermgr import HEARTBEAT_HOLD_MAX, CodeModeRule
from blobstore_server.libs.proto.scheduler import DEFAULT_BROKEN_AFTER
from blobstore_server.libs.rpc.config import ServiceSettings
from blobstore_server.libs.rpc.routes import Capability


class Member(BaseModel):
    raft_addr: str  # host:port of the Raft transport
    http_addr: str  # host:port of the HTTP API


class ClusterMgrConfig(ServiceSettings):
    node_id: int = Field(ge=1)
    members: dict[int, Member] = Field(min_length=1)  # the initial voters, and this node itself
    join: bool = False  # this node is not an initial voter: it waits to be added (/raft/member/add)
    data_dir: str
    cluster_id: int = Field(1, ge=0, lt=2**32)
    idcs: list[str] = Field(default_factory=lambda: ["z0"])
    code_modes: list[CodeModeRule] = Field(default_factory=lambda: [CodeModeRule(code_mode="EC3P3")])
    codec_backend: str = DEFAULT_BACKEND
    chunk_size: int = Field(16 << 30, ge=1 << 20)  # capacity of one unit's chunk
    # An allocator's lease on a volume; access writes to what it was granted until the lease ends, so this must
    # outlast access's standby_ride_out (60 s) plus the allocator's retain_interval and lease_margin.
    volume_lease_ttl: float = Field(90.0, gt=0)
    disk_heartbeat_timeout: float = Field(30.0, gt=0)  # a disk not heard from for longer is dead
    # Seeds the replicated `disk_broken_after` config unless an operator set it: seconds without a heartbeat
    # after which the scheduler repairs a disk unattended. Ten minutes rides out a reboot, as Ceph's
    # mon_osd_down_out_interval (600 s) and HDFS's dead-node interval (630 s) do. None ("off"): only an
    # operator or the blobnode marks a disk broken.
    disk_broken_after: float | None = Field(DEFAULT_BROKEN_AFTER, gt=0)
    repair_reserve_chunks: int = Field(2, ge=0)  # chunk slots per disk that volume creation leaves to repair
    # Volume creation's chunk creations and releases (a file and a synced record each) take milliseconds: a node
    # slower than this is hung, and its disk is left out of the next creations until it heartbeats again
    chunk_request_timeout: float = Field(5.0, gt=0)
    # No volume is created before this many disks are registered: a launcher that starts N disks sets N,
    # so the first volumes spread over every host. Once any volume exists it no longer applies.
    first_volume_after_disks: int = Field(0, ge=0)
    volume_check_interval: float = Field(1.0, gt=0)
    # When an allocator finds no volume clear of the disks its writers avoid, one is created for it: at most one
    # per code mode per this many seconds
    avoiding_volume_interval: float = Field(1.0, gt=0)
    fsync: bool = True
    # Disk heartbeats wait up to this long to be committed together, as one Raft entry (0: each alone). Keep it
    # well under disk_heartbeat_timeout: a beat is recorded when its batch commits. At most HEARTBEAT_HOLD_MAX,
    # what blobnodes allow for it on top of their attempt timeout.
    disk_heartbeat_batch: float = Field(1.0, ge=0, le=HEARTBEAT_HOLD_MAX)
    heartbeat_ms: int = Field(50, ge=5)
    election_timeout_ms: tuple[int, int] = (300, 600)
    snapshot_threshold: int = Field(20000, ge=1)  # applied commands between state snapshots
    snapshot_keep: int = Field(5000, ge=0)  # log entries kept behind a snapshot for lagging replicas
    session_ttl: float = Field(600.0, gt=0)  # a client session idle this long is forgotten (seconds)
    session_limit: int = Field(10_000, ge=1)  # client sessions remembered at most; the longest idle go first
    fault_hooks: bool = False  # tests only: enables POST /fault/drop_reply (cut replies after commit)

    @model_validator(mode="after")
    def _self_is_member(self) -> ClusterMgrConfig:
        if self.node_id not in self.members:
            raise ValueError(f"node_id {self.node_id} is not among the members {sorted(self.members)}")
        return self

    @property
    def me(self) -> Member:
        return self.members[self.node_id]

    def open_links(self) -> list[str]:
        if self.auth is not None and Capability.RAFT_MEMBER not in self.auth.keys:
            return ["the Raft port takes any peer (no `raft-member` key in `auth`): anyone who reaches it can vote "
                    "or append entries"]
        return []
