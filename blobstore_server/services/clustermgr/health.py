"""Which volumes may take new blobs, judged from their units' disks. Pure: the leasing and retaining
commands, the volume floor and the volume list all ask here, so they agree.

A unit is down when its disk is out of service (broken, being repaired, dropped) or its blobnode sent
no heartbeat within the timeout. A volume is writable when it is not locked, has room, and no unit is
down. A volume with down units still reaches its put quorum while they number at most the code's put
slack: the allocator falls back to such a volume only when no writable one is left.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from blobstore_server.libs.ec import Tactic
from blobstore_server.libs.proto.cluster import DiskInfo, DiskStatus, VolumeHealth, VolumeInfo, VolumeStatus

OUT_OF_SERVICE = frozenset({DiskStatus.BROKEN, DiskStatus.REPAIRING, DiskStatus.REPAIRED, DiskStatus.DROPPED})


def disk_trouble(disk: DiskInfo | None, now: float, heartbeat_timeout: float) -> str:
    """Why a unit on this disk cannot take a write now; empty when it can."""
    if disk is None:
        return "its disk is not registered"
    if disk.status in OUT_OF_SERVICE:
        return f"disk {disk.disk_id} is {disk.status}"
    if not disk.heard_from(now, heartbeat_timeout):
        return f"disk {disk.disk_id} sent no heartbeat for {now - disk.last_heartbeat:.0f} s"
    return ""


def volume_health(volume: VolumeInfo, disks: Mapping[int, DiskInfo], now: float,
                  heartbeat_timeout: float) -> VolumeHealth:
    reasons = []
    if volume.status is VolumeStatus.LOCK:
        reasons.append("locked while a unit moves")
    if volume.free <= 0:
        reasons.append("full")
    down = []
    for index, unit in enumerate(volume.units):
        trouble = disk_trouble(disks.get(unit.disk_id), now, heartbeat_timeout)
        if trouble:
            down.append(index)
            reasons.append(f"unit {index}: {trouble}")
    return VolumeHealth(writable=not reasons, why_not="; ".join(reasons), down_units=down)


def unleased(volume: VolumeInfo, now: float) -> bool:
    """No live lease holds the volume: idle, or its holder stopped renewing."""
    return volume.status is VolumeStatus.IDLE or (volume.status is VolumeStatus.ACTIVE and volume.lease_expiry < now)


def lease_rank(tactic: Tactic, volume: VolumeInfo, health: VolumeHealth, avoid_disks: Collection[int]) -> int | None:
    """How many of the volume's units a writer should expect to miss (down, or on a disk the asker
    avoids): lower leases first; None when that many would miss the put quorum."""
    missing = set(health.down_units) | {i for i, u in enumerate(volume.units) if u.disk_id in avoid_disks}
    return len(missing) if len(missing) <= tactic.put_slack else None
