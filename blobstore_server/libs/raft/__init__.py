"""Raft for the metadata service: an I/O-free core (`RaftNode`) inside an asyncio shell
(`RaftServer`) that persists to RocksDB with group commit and talks to peers over persistent
TCP connections. See `server.py` for the public API and `core.py` for the protocol rules."""

from blobstore_server.libs.raft.config import RaftConfig
from blobstore_server.libs.raft.core import RaftNode
from blobstore_server.libs.raft.errors import (
    ConfigChangeInProgress,
    InvariantViolation,
    LeadershipLost,
    NotLeader,
    ProposalDropped,
    RaftError,
)
from blobstore_server.libs.raft.messages import Member, SnapshotMeta
from blobstore_server.libs.raft.server import RaftServer, StateMachine

__all__ = [
    "ConfigChangeInProgress",
    "InvariantViolation",
    "LeadershipLost",
    "Member",
    "NotLeader",
    "ProposalDropped",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "RaftServer",
    "SnapshotMeta",
    "StateMachine",
]
