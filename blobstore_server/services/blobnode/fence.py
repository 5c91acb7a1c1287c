"""The blobnode's fences, free of I/O: which scheduler may still change a disk's chunks, and which task may
still destroy shards on a chunk it fills (`disk.py` applies them under its locks).

- Scheduler epoch: every chunk state change a scheduler sends carries the epoch of its lease; a disk keeps
  the highest it has seen (persisted) and refuses an older one. A superseded scheduler that wakes up (a pause,
  a partition) thus cannot reopen a sealed source or release a chunk on a disk its successor has addressed.
  Its successor addresses every source it relies on when it takes over (it seals them again).
- Task fence (`TaskFence`): a task's destination takes a destructive call (discard) only with the token of
  the task's current hand-out; once closed (before the switch to it) with none, so a worker that lost its
  task (paused past its lease, its task finished by another) cannot discard a shard a PUT acknowledged on
  the new live unit. A call without a token (a repair of a live unit) is taken where no task fills the chunk.
  Only a chunk a scheduler created (for a task) ever opens: one clustermgr created for a volume is live from
  the start, so not even a scheduler's key (which mints discard tickets) can open it to discard its shards.
- Write fence (`WriteFence`): shard writes are taken only while clustermgr counts the node in. A node cut off
  from clustermgr but not from access nodes would otherwise take PUTs on units the scheduler rebuilds
  elsewhere meanwhile, which the new units never receive (each such blob one shard short, unnoticed).
"""

from __future__ import annotations

import math

from blobstore_server.libs.proto.blobnode import ChunkInfo, TaskFence
from blobstore_server.libs.proto.cluster import WRITE_FENCED, DiskStatus
from blobstore_server.libs.proto.clustermgr import HeartbeatAnswer
from blobstore_server.libs.rpc.errors import Conflict, Fenced, WriteFenced


def check_scheduler_epoch(highest: int, epoch: int, disk_id: int) -> None:
    """Refuse a change sent under scheduler lease `epoch` when the disk has seen a newer one (`highest`)."""
    if epoch < highest:
        raise Fenced(f"scheduler epoch {epoch} is superseded: disk {disk_id} has seen epoch {highest}; nothing changed",
                     epoch=highest)


def fenced_for_task(record: ChunkInfo, token: int | None) -> ChunkInfo:
    """The chunk's record with its task fence opened at `token`, or closed (None). A closed fence stays closed (a
    live unit never becomes a task's destination again); a token older than the last one opened is refused (a
    hand-out given up on, whose request arrived late). Conflict, not Fenced: the scheduler sending it is not
    superseded, it has a stale view of this chunk."""
    closed = record.task_fence is TaskFence.CLOSED
    if token is None:
        return record if closed else record.model_copy(update={"task_fence": TaskFence.CLOSED})
    if closed:
        raise Conflict(f"the chunk of vuid {record.vuid} is live: its task fence closed at token {record.task_token}")
    if record.task_fence is TaskFence.NONE:
        raise Conflict(f"the chunk of vuid {record.vuid} is a volume's unit, not a task's destination (a scheduler "
                       "creates those): its task fence never opens")
    if token < record.task_token:
        raise Conflict(f"task token {token} is older than the chunk's {record.task_token}: not opened")
    return record.model_copy(update={"task_fence": TaskFence.OPEN, "task_token": token})


def check_task_token(record: ChunkInfo, token: int | None) -> None:
    """Refuse a destructive call carrying task `token` (None: not a task's call) that the chunk's fence does not
    take: a token other than the open one, any token where no task fills the chunk, and no token where one does."""
    fence, current = record.task_fence, record.task_token
    if fence is TaskFence.OPEN and token != current:
        held = f"task token {token} is not" if token is not None else "a call without a task token is not"
        raise Fenced(f"{held} the one the chunk of vuid {record.vuid} is being filled under ({current}): refused")
    if fence is not TaskFence.OPEN and token is not None:
        why = "is live: its task fence closed" if fence is TaskFence.CLOSED else "is filled by no task"
        raise Fenced(f"task token {token} refused: the chunk of vuid {record.vuid} {why}")


class WriteFence:
    """Open until `write_fence_s` after the *sending* of the last heartbeat clustermgr answered (clustermgr's record
    of the beat, from which anyone measures the node's silence, is no earlier), for the disks whose status in that
    answer takes writes. Shut before the first answer: a node restarted while cut off takes nothing. A node with
    no clustermgr (a test's, a tool's) is `guarded=False`: always open. Times are one monotonic clock's."""

    def __init__(self, guarded: bool) -> None:
        self.guarded = guarded
        self.open_until = -math.inf
        self.statuses: dict[int, DiskStatus] = {}

    def answered(self, sent_at: float, answer: HeartbeatAnswer) -> None:
        """The beat sent at `sent_at` was answered: the latest answer's fence stands, even a shorter one."""
        self.open_until = sent_at + answer.write_fence_s
        self.statuses = dict(answer.statuses)

    def refusal(self, disk_id: int, now: float) -> WriteFenced | None:
        """Why a shard write to `disk_id` is refused now, or None."""
        if not self.guarded:
            return None
        if now >= self.open_until:
            why = ("no heartbeat answered yet" if self.open_until == -math.inf
                   else f"no heartbeat answered for {now - self.open_until:.1f} s past its write fence")
            return WriteFenced(f"this blobnode takes no writes: {why} (clustermgr may be repairing its disks)")
        status = self.statuses.get(disk_id)
        if status is None or status in WRITE_FENCED:
            return WriteFenced(f"disk {disk_id} takes no writes: clustermgr has it {status or 'unknown'}")
        return None
