"""Raft for the metadata service: an I/O-free core (`RaftNode`) inside an asyncio shell
(`RaftServer`) that persists to RocksDB with group commit and talks to peers over persistent
TCP connections. See `server.py` for the public API and `core.py` for the protocol rules."""

from libs.raft.config import RaftConfig
from libs.raft.core import RaftNode
from libs.raft.errors import (
    ConfigChangeInProgress,
    InvariantViolation,
    LeadershipLost,
    NotLeader,
    ProposalDropped,
    RaftError,
)
from libs.raft.messages import Member, SnapshotMeta
from libs.raft.server import RaftServer, StateMachine

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
