"""Configuration of one Raft node, validated in one place."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator


class RaftTLS(BaseModel):
    """Raft over TLS: this node's certificate and key, and the CA its peers' certificates are checked against
    (None: the system's roots)."""

    cert_file: str
    key_file: str
    ca_file: str | None = None


class RaftConfig(BaseModel):
    """Times are in milliseconds. Election timeouts are drawn uniformly from the range; the
    leader steps down when it has not heard from a quorum for `election_ms[0]`."""

    node_id: int
    peers: dict[int, str] = Field(description="initial voters, id -> host:port (this node included)")
    data_dir: Path
    listen: str | None = Field(default=None, description="host:port for peers; defaults to peers[node_id]")
    join: bool = Field(default=False, description="start outside the cluster, to be added as a learner")
    tick_ms: float = 25.0
    heartbeat_ms: float = 50.0
    election_ms: tuple[float, float] = (300.0, 600.0)
    max_batch: int = Field(default=1024, description="entries per AppendEntries and per proposal batch")
    max_inflight: int = Field(default=65536, description="entries sent ahead of a follower's acknowledgement")
    snapshot_threshold: int = Field(default=20000, description="applied entries between snapshots")
    snapshot_keep: int = Field(default=5000, description="log entries kept behind a snapshot for lagging peers")
    snapshot_chunk: int = 1 << 20
    checksum_interval: int = Field(default=1000, description="compare state checksums at multiples of this index")
    fsync: bool = True
    propose_timeout: float = 5.0
    member_key: str | None = Field(default=None, description="hex; peers must prove they hold it to connect")
    tls: RaftTLS | None = Field(default=None, description="encrypt every connection between peers")

    @model_validator(mode="after")
    def _check(self) -> RaftConfig:
        if not self.join and self.node_id not in self.peers:
            raise ValueError("node_id must be one of peers unless join is set")
        if self.listen is None and self.node_id not in self.peers:
            raise ValueError("a joining node needs `listen`")
        if not (self.tick_ms <= self.heartbeat_ms < self.election_ms[0] <= self.election_ms[1]):
            raise ValueError("need tick_ms <= heartbeat_ms < election_ms[0] <= election_ms[1]")
        return self

    @property
    def listen_addr(self) -> str:
        return self.listen or self.peers[self.node_id]

    def ticks(self, ms: float) -> int:
        return max(1, round(ms / self.tick_ms))
