"""Unit commands: moving a volume's unit to another disk, reserved first, then committed or given up."""

from __future__ import annotations

from blobstore_server.libs.kv import Batch
from blobstore_server.libs.placement import shares_a_host
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.cluster import Unit, VolumeInfo
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import BadRequest, Conflict
from blobstore_server.services.clustermgr.commands.table import Command, command
from blobstore_server.services.clustermgr.state import ClusterState


class UnitAllocCmd(Command[Unit]):
    op = "volume_unit_alloc"
    vid: int
    index: int
    disk_id: int


@command(UnitAllocCmd)
def volume_unit_alloc(s: ClusterState, batch: Batch, now: float, cmd: UnitAllocCmd) -> Unit:
    """Reserve a new chunk location for unit `index`: the same unit with epoch + 1."""
    volume = s.volume(cmd.vid)
    if not 0 <= cmd.index < len(volume.units):
        raise BadRequest(f"volume {cmd.vid} has no unit {cmd.index}")
    disk = s.disk(cmd.disk_id)
    if not disk.writable:
        raise Conflict(f"disk {cmd.disk_id} cannot take a unit (status {disk.status}, readonly {disk.readonly})")
    if any(u.disk_id == cmd.disk_id for i, u in enumerate(volume.units) if i != cmd.index):
        raise Conflict(f"disk {cmd.disk_id} already holds a unit of volume {cmd.vid}")
    current = Vuid(volume.units[cmd.index].vuid)
    pending = volume.pending_units.get(cmd.index)
    epoch = max(current.epoch(), Vuid(pending.vuid).epoch() if pending else 0,
                volume.dropped_epochs.get(cmd.index, 0)) + 1
    unit = Unit(vuid=Vuid.make(cmd.vid, cmd.index, epoch), disk_id=cmd.disk_id, host=disk.host)
    volume.pending_units[cmd.index] = unit
    s.put_volume(batch, volume)
    # Counted at once, as a volume's units are: the next reservations, made before the disk's next heartbeat
    # reports its chunks, then go to other disks instead of piling every move of a lost disk onto one.
    s.put_disk(batch, disk.model_copy(update={"chunks": disk.chunks + 1}))
    return unit


class UnitReleaseCmd(api.UnitRelease, Command[VolumeInfo]):
    op = "volume_unit_release"


@command(UnitReleaseCmd)
def volume_unit_release(s: ClusterState, batch: Batch, now: float, cmd: UnitReleaseCmd) -> VolumeInfo:
    """Ordered in the log after every unit switch, and fenced like them, it tells a scheduler whether the chunk it
    means to release is still no volume's live unit. Releasing the unit reserved for a move (a move given up)
    drops the reservation, so the volume can be unlocked; its epoch is never issued again, so a stale writer to
    that chunk stays refused."""
    volume = s.volume(cmd.vid)
    index = Vuid(cmd.vuid).index()
    if Vuid(cmd.vuid).vid() != cmd.vid or index >= len(volume.units):
        raise BadRequest(f"vuid {cmd.vuid} names no unit of volume {cmd.vid}")
    if volume.units[index].vuid == cmd.vuid:
        raise Conflict(f"vuid {cmd.vuid} is unit {index} of volume {cmd.vid}, live: its chunk stays")
    pending = volume.pending_units.get(index)
    if pending is not None and pending.vuid == cmd.vuid:
        if cmd.disk_id is not None and cmd.disk_id != pending.disk_id:
            raise BadRequest(f"vuid {cmd.vuid} was reserved on disk {pending.disk_id}, not on {cmd.disk_id}")
        del volume.pending_units[index]
        volume.dropped_epochs[index] = Vuid(cmd.vuid).epoch()
        s.put_volume(batch, volume)
    return volume


def dead_for_good(volume: VolumeInfo, vuid: int) -> bool:
    """Whether the chunk of `vuid` can never hold a live unit of `volume` (as the volume stands after a unit
    release of it): its epoch was issued, and it is neither the live unit nor the move reserved. An epoch never
    issued yet may still be: a release ticket is made only for a dead one."""
    index, epoch = Vuid(vuid).index(), Vuid(vuid).epoch()
    if Vuid(vuid).vid() != volume.vid or index >= len(volume.units):
        return False
    pending = volume.pending_units.get(index)
    if vuid == volume.units[index].vuid or (pending is not None and vuid == pending.vuid):
        return False
    issued = max(Vuid(volume.units[index].vuid).epoch(), Vuid(pending.vuid).epoch() if pending else 0,
                 volume.dropped_epochs.get(index, 0))
    return epoch <= issued


class UnitUpdateCmd(api.UnitUpdate, Command[VolumeInfo]):
    op = "volume_unit_update"


@command(UnitUpdateCmd)
def volume_unit_update(s: ClusterState, batch: Batch, now: float, cmd: UnitUpdateCmd) -> VolumeInfo:
    """Commit a moved unit; only the newest reserved epoch for that unit is accepted."""
    volume = s.volume(cmd.vid)
    if not 0 <= cmd.index < len(volume.units):
        raise BadRequest(f"volume {cmd.vid} has no unit {cmd.index}")
    pending = volume.pending_units.get(cmd.index)
    if pending is None or pending.vuid != cmd.vuid or pending.disk_id != cmd.disk_id:
        raise Conflict(f"unit {cmd.index} of volume {cmd.vid}: vuid {cmd.vuid} on disk {cmd.disk_id} is not the"
                       f" reserved move (current epoch {Vuid(volume.units[cmd.index].vuid).epoch()})")
    volume.units[cmd.index] = pending
    del volume.pending_units[cmd.index]
    volume.dropped_epochs.pop(cmd.index, None)  # below the live epoch now
    volume.under_spread = shares_a_host(s.disk(u.disk_id).machine for u in volume.units)
    s.put_volume(batch, volume)
    return volume
