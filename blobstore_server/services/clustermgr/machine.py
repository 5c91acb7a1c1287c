"""clustermgr's Raft state machine: each committed command (`commands/`) applied to the state (`state.py`), once
per client session, its writes and the applied index in one atomic batch."""

from __future__ import annotations

from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.clustermgr import sessions
from blobstore_server.services.clustermgr.commands import table
from blobstore_server.services.clustermgr.state import APPLIED_KEY, META, ClusterState


class ClusterMachine(ClusterState):
    """The state Raft drives: `apply` on top of the storage's reads, writes, snapshots and restores."""

    def apply(self, index: int, command: bytes) -> bytes:
        """Apply one committed command, once per client session: a retry gets the first answer back."""
        self.applying = index
        batch = self.kv.batch()
        try:
            logged = table.decode(command)
            visit = sessions.Visit(self.kv, logged.session) if logged.session else None
            answer = visit.recall() if visit else None
        except RpcError as exc:
            answer = table.refusal(exc)
        else:
            fresh = None
            if answer is None:
                answer, accepted = table.apply(self, batch, logged)
                if not accepted:
                    batch = self.kv.batch()  # a refused command changes nothing (but is remembered)
                fresh = answer
            if visit:
                visit.record(batch, logged.now, fresh)
        batch.put(META, APPLIED_KEY, str(index).encode())
        self.kv.write(batch)
        return answer
