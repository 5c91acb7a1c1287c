"""The scheduler's copy of clustermgr's volumes, kept current by asking only for what changed since the last
answer: a full list of 10,000 volumes is ~7 MB of JSON and most of a second of CPU on each side, and the
scheduler looks every round."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from blobstore_server.libs.proto.cluster import VolumeInfo
from blobstore_server.services.clustermgr.client import ClusterClient


class VolumeMirror:
    """Volumes by vid as of the last `refresh`. Their health fields are as of when each last changed: stale."""

    def __init__(self, cluster: ClusterClient) -> None:
        self.cluster = cluster
        self.revision = 0  # the Raft index the copy reflects (0: nothing yet)
        self._volumes: dict[int, VolumeInfo] = {}
        self._lock = asyncio.Lock()  # answers applied in the order asked, so the revision only moves forward

    async def refresh(self) -> Mapping[int, VolumeInfo]:
        """Every volume now, by vid (a copy: later refreshes do not change it)."""
        async with self._lock:
            answer = await self.cluster.volumes_changed_since(self.revision)
            if answer.revision < self.revision:  # not the history this copy followed (a new cluster): start over
                self._volumes = {}
                answer = await self.cluster.volumes_changed_since(0)
            self._volumes.update((v.vid, v) for v in answer.volumes)
            self.revision = answer.revision
            return dict(self._volumes)
