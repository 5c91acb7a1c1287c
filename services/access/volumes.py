"""Volume info for access: in-process cache, then Redis (optional), then clustermgr.

Entries expire after a TTL, and `invalidate` drops one at once: a blobnode answering that a
unit moved (stale epoch, or no such chunk) means the cached units are wrong and must be
fetched again, never served.
"""

from __future__ import annotations

import time
from typing import Any

from libs.proto.cluster import VolumeInfo
from services.clustermgr.client import ClusterClient


class VolumeCache:
    def __init__(self, cluster: ClusterClient, ttl: float, redis: Any = None) -> None:
        self.cluster = cluster
        self.ttl = ttl
        self.redis = redis  # a redis.asyncio.Redis, or None
        self._local: dict[int, tuple[float, VolumeInfo]] = {}

    @staticmethod
    def _key(vid: int) -> str:
        return f"blobstore:volume:{vid}"

    async def get(self, vid: int) -> VolumeInfo:
        hit = self._local.get(vid)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        volume = None
        if self.redis is not None:
            raw = await self.redis.get(self._key(vid))
            if raw is not None:
                volume = VolumeInfo.model_validate_json(raw)
        if volume is None:
            volume = await self.cluster.get_volume(vid)
            if self.redis is not None:
                await self.redis.set(self._key(vid), volume.model_dump_json(), ex=max(1, int(self.ttl)))
        self._local[vid] = (time.monotonic() + self.ttl, volume)
        return volume

    async def invalidate(self, vid: int) -> None:
        self._local.pop(vid, None)
        if self.redis is not None:
            await self.redis.delete(self._key(vid))
