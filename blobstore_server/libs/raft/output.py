"""What the core asks of its shell after a batch of events: the I/O it must do, as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum

from blobstore_server.libs.raft.messages import Entry, Members, Message, SnapshotMeta


@dataclass(slots=True, frozen=True)
class HardState:
    term: int
    vote: int | None


@dataclass(slots=True)
class Output:
    """Instructions, to be carried out in this order:

    1. `members`: the membership changed (for the transport). `restore`: load the received
       snapshot into the state machine, now.
    2. Persist durably, in one synced write and in order with earlier outputs: `hard_state`;
       `log_reset` (drop every log entry: the log now starts after this (index, term)); delete
       entries >= `truncate_from`; write `entries`; delete entries <= `compact_to` (index, term).
    3. `send` may go at once; `send_after_persist` only once step 2 (and every earlier output's
       step 2) is durable. Then call `RaftNode.persisted(last entry index, term)`.
    4. `apply` entries in order (they are committed and durable here), reporting each through
       `RaftNode.on_applied`.
    5. `send_snapshot`: stream the latest local snapshot to these peers.
    6. `reads`: (request id, read index) pairs, linearizable once applied >= read index;
       `reads_failed`: request ids that lost leadership before being confirmed.
    """

    hard_state: HardState | None = None  # term/vote changed: persist before sending anything after
    commit: int = 0  # the commit index, worth storing with the next write (no sync needed)
    restore: SnapshotMeta | None = None
    log_reset: tuple[int, int] | None = None
    truncate_from: int | None = None
    entries: list[Entry] = field(default_factory=list)
    compact_to: tuple[int, int] | None = None
    send: list[Message] = field(default_factory=list)
    send_after_persist: list[Message] = field(default_factory=list)
    apply: list[Entry] = field(default_factory=list)
    send_snapshot: list[int] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)
    reads_failed: list[int] = field(default_factory=list)
    members: Members | None = None  # set when membership changed, for the transport

    def durable(self) -> bool:
        """Whether step 2 has anything to write (the commit index alone is not worth a synced write)."""
        return bool(self.hard_state or self.log_reset is not None or self.truncate_from is not None
                    or self.entries or self.compact_to is not None)

    def needs_persist(self, earlier_unwritten: bool = True) -> bool:
        """Whether this output must wait for step 2. With nothing durable of its own and no earlier output still
        unwritten (`earlier_unwritten` false), its `send_after_persist` may go at once: a follower answers a
        heartbeat without a synced write."""
        return self.durable() or (bool(self.send_after_persist) and earlier_unwritten)


class Role(StrEnum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class Flow(Enum):
    """How the leader feeds one peer (the etcd/raft progress states)."""

    PROBE = 1  # one append at a time until a match is found
    REPLICATE = 2  # pipelined: next runs ahead of match without waiting for acks
    SNAPSHOT = 3  # the entries it needs are compacted; a snapshot is being streamed


@dataclass(slots=True)
class Progress:
    match: int = 0
    next: int = 1
    flow: Flow = Flow.PROBE
    probe_sent: bool = False
    acked_seq: int = 0
    last_hb_match: int = 0
    stalls: int = 0
