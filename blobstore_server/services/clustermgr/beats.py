"""Blobnodes' disk heartbeats, committed together: alone, each would be a Raft entry appended and fsynced on
every replica (six blobnodes beating every second made 6 of an idle cluster's 8 entries a second)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from blobstore_server.libs.proto.clustermgr import DiskBeat, DiskIds
from blobstore_server.services.clustermgr.commands import DiskHeartbeatCmd


class HeartbeatBatcher:
    """Holds each report up to `window` seconds and commits every report gathered meanwhile as one command (a
    disk's latest report wins); each caller is answered when that command commits, or with its error.
    `window` 0 commits each report alone."""

    def __init__(self, commit: Callable[[DiskHeartbeatCmd], Awaitable[DiskIds]], window: float) -> None:
        self.commit = commit
        self.window = window
        self._pending: dict[int, DiskBeat] = {}
        self._waiting: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def beat(self, report: DiskHeartbeatCmd) -> DiskIds:
        if self.window <= 0:
            return await self.commit(report)
        for beat in report.disks:
            self._pending[beat.disk_id] = beat
        committed = asyncio.get_running_loop().create_future()
        self._waiting.append(committed)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_after(self.window))
        await committed
        return DiskIds(disks=[beat.disk_id for beat in report.disks])

    async def _flush_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        beats, waiting = list(self._pending.values()), self._waiting
        self._pending, self._waiting, self._flusher = {}, [], None
        error: BaseException | None = None
        try:
            await self.commit(DiskHeartbeatCmd(disks=beats))
        except Exception as exc:  # every caller hears it (not leader, no quorum): each retries at its next beat
            error = exc
        for committed in waiting:
            if not committed.done():  # a caller that went away meanwhile cancelled its own
                committed.set_exception(error) if error is not None else committed.set_result(None)
