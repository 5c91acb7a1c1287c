"""Blobnodes' disk heartbeats, committed together: alone, each would be a Raft entry appended and fsynced on
every replica (six blobnodes beating every second made 6 of an idle cluster's 8 entries a second)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from blobstore_server.libs.proto.clustermgr import DiskBeat, HeartbeatAnswer
from blobstore_server.services.clustermgr.commands.disks import DiskHeartbeatCmd


class HeartbeatBatcher:
    """Holds each report up to `window` seconds and commits every report gathered meanwhile as one command (a
    disk's latest report wins); each caller is answered when that command commits, or with its error.
    `window` 0 commits each report alone."""

    def __init__(self, commit: Callable[[DiskHeartbeatCmd], Awaitable[HeartbeatAnswer]], window: float) -> None:
        self.commit = commit
        self.window = window
        self._pending: dict[int, DiskBeat] = {}
        self._waiting: list[asyncio.Future[HeartbeatAnswer]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def beat(self, report: DiskHeartbeatCmd) -> HeartbeatAnswer:
        if self.window <= 0:
            return await self.commit(report)
        for beat in report.disks:
            self._pending[beat.disk_id] = beat
        committed: asyncio.Future[HeartbeatAnswer] = asyncio.get_running_loop().create_future()
        self._waiting.append(committed)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_after(self.window))
        answer = await committed
        return answer.model_copy(update={"statuses": {beat.disk_id: answer.statuses[beat.disk_id]
                                                       for beat in report.disks}})

    async def _flush_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        beats, waiting = list(self._pending.values()), self._waiting
        self._pending, self._waiting, self._flusher = {}, [], None
        answer: HeartbeatAnswer | Exception
        try:
            answer = await self.commit(DiskHeartbeatCmd(disks=beats))
        except Exception as exc:  # every caller hears it (not leader, no quorum): each retries at its next beat
            answer = exc
        for committed in waiting:
            if not committed.done():  # a caller that went away meanwhile cancelled its own
                if isinstance(answer, Exception):
                    committed.set_exception(answer)
                else:
                    committed.set_result(answer)
