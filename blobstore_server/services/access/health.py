"""What access has learnt about disks and volumes from its own shard calls; pure, the clock is an argument.

Punishment (CubeFS access punishes a volume or disk for a while after failures): a disk that did not
answer, or answered with a server error, is punished for `disk_punish` seconds: PUTs skip it while the
rest still reach the quorum, the allocator is asked to avoid volumes on it, and reads ask it last. A
volume on which a blob missed its quorum is punished for `volume_punish` seconds: the allocator must not
hand it out. A disk that left a read waiting past the hedge delay is slow for `disk_punish` seconds:
reads ask it last (as Apache BookKeeper orders reads by each bookie's failure history), writes still
go to it. So a dead or hung node costs one timeout per punishment period, not one per request; when
the period ends the next call tries it again, and one success clears it at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HealthTable:
    disk_punish: float
    volume_punish: float
    slow_after: float  # a shard call slower than this marks its disk slow (the read hedge delay)
    _failed: dict[int, float] = field(default_factory=dict)  # disk id -> punished until
    _slow: dict[int, float] = field(default_factory=dict)  # disk id -> read last until
    _volumes: dict[int, float] = field(default_factory=dict)  # vid -> not allocated from until

    def succeeded(self, disk_id: int, now: float, read_latency: float | None = None) -> None:
        """The disk answered; a read's latency also says whether it is slow (a write's includes its fsync)."""
        self._failed.pop(disk_id, None)
        if read_latency is None:
            return
        if read_latency < self.slow_after:
            self._slow.pop(disk_id, None)
        else:
            self.slow(disk_id, now)

    def failed(self, disk_id: int, now: float) -> None:
        self._failed[disk_id] = now + self.disk_punish

    def slow(self, disk_id: int, now: float) -> None:
        self._slow[disk_id] = now + self.disk_punish

    def punish_volume(self, vid: int, now: float) -> None:
        self._volumes[vid] = now + self.volume_punish

    def punished(self, disk_id: int, now: float) -> bool:
        """PUTs skip this disk (when the quorum allows) and the allocator avoids its volumes."""
        return self._failed.get(disk_id, 0.0) > now

    def read_last(self, disk_id: int, now: float) -> bool:
        return self.punished(disk_id, now) or self._slow.get(disk_id, 0.0) > now

    def avoided_disks(self, now: float) -> list[int]:
        return _live(self._failed, now)

    def excluded_volumes(self, now: float) -> list[int]:
        return _live(self._volumes, now)


def _live(until: dict[int, float], now: float) -> list[int]:
    """The keys still in force; expired ones are forgotten so the lists sent to the allocator stay short."""
    for key in [k for k, t in until.items() if t <= now]:
        del until[key]
    return sorted(until)
