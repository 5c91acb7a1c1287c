"""Disk commands: registering a disk, its heartbeats, its status."""

from __future__ import annotations

from blobstore_server.libs.kv import Batch
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.cluster import DISK_TRANSITIONS, DiskInfo, write_fence_for
from blobstore_server.libs.proto.clustermgr import DiskAdd, HeartbeatAnswer
from blobstore_server.libs.proto.scheduler import BROKEN_AFTER_KEY, parse_broken_after
from blobstore_server.libs.rpc.errors import BadRequest, Conflict
from blobstore_server.services.clustermgr.commands.table import Command, command
from blobstore_server.services.clustermgr.state import ClusterState


class DiskAddCmd(Command[DiskInfo]):
    op = "disk_add"
    disk: DiskAdd


@command(DiskAddCmd)
def disk_add(s: ClusterState, batch: Batch, now: float, cmd: DiskAddCmd) -> DiskInfo:
    # no answer has opened its node's write fence yet: the first beat's is the only one to wait out
    info = DiskInfo.model_validate({**cmd.disk.model_dump(), "last_heartbeat": now,
                                    "write_fence_s": write_fence_for(parse_broken_after(s.config(BROKEN_AFTER_KEY)))})
    if info.disk_id > s.scope("disk_id"):
        raise BadRequest(f"disk id {info.disk_id} was never allocated; use /disk/alloc_id")
    if s.has_disk(info.disk_id):
        raise Conflict(f"disk id {info.disk_id} is already registered")
    s.put_disk(batch, info)
    return info


class DiskHeartbeatCmd(api.DiskHeartbeat, Command[HeartbeatAnswer]):
    op = "disk_heartbeat"


@command(DiskHeartbeatCmd)
def disk_heartbeat(s: ClusterState, batch: Batch, now: float, cmd: DiskHeartbeatCmd) -> HeartbeatAnswer:
    """Answer each beat with the write fence `disk_broken_after` gives (as it stands in the log) and record with it
    how long the node may take writes after this beat: that fence, or a longer one an earlier answer gave that may
    still be open (the answer to this beat may never arrive), so whoever finds the disk silent can wait it out."""
    fence = write_fence_for(parse_broken_after(s.config(BROKEN_AFTER_KEY)))
    statuses = {}
    for beat in cmd.disks:
        info = s.disk(beat.disk_id)
        held = info.last_heartbeat + info.write_fence_s - now  # what is left of the fence recorded before
        s.put_disk(batch, info.model_copy(update={"size": beat.size, "free": beat.free, "chunks": beat.chunks,
                                                   "trash_bytes": beat.trash_bytes, "scrub_late_s": beat.scrub_late_s,
                                                   "last_heartbeat": now, "write_fence_s": max(fence, held)}))
        statuses[beat.disk_id] = info.status
    return HeartbeatAnswer(statuses=statuses, write_fence_s=fence)


class DiskSetCmd(api.DiskSet, Command[DiskInfo]):
    op = "disk_set"


@command(DiskSetCmd)
def disk_set(s: ClusterState, batch: Batch, now: float, cmd: DiskSetCmd) -> DiskInfo:
    info = s.disk(cmd.disk_id)
    if cmd.status is not None:
        if cmd.status != info.status and cmd.status not in DISK_TRANSITIONS[info.status]:
            raise Conflict(f"disk {cmd.disk_id} cannot go from {info.status} to {cmd.status}")
        info.status = cmd.status
    if cmd.readonly is not None:
        info.readonly = cmd.readonly
    s.put_disk(batch, info)
    return info
