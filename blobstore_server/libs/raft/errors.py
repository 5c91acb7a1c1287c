"""Errors of the Raft library."""

from __future__ import annotations


class RaftError(Exception):
    """Base class of the errors a caller may handle."""


class NotLeader(RaftError):
    """This node cannot serve the request; `leader_hint` is the leader it last heard of."""

    def __init__(self, leader_hint: int | None) -> None:
        super().__init__(f"not leader (leader hint: {leader_hint})")
        self.leader_hint = leader_hint


class ProposalDropped(RaftError):
    """The proposal's log slot was taken by another leader's entry: it will never apply."""


class LeadershipLost(RaftError):
    """The node stopped leading before the proposal committed: it may still commit under the next
    leader, or never. The outcome is unknown, as after a timeout."""


class ConfigChangeInProgress(RaftError):
    """One membership change at a time: the previous one is not committed yet."""


class InvariantViolation(AssertionError):
    """A safety rule of the protocol was broken. Never caught: the process must stop loudly."""
