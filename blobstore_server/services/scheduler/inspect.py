"""Volume inspection: compare the bid lists of every unit of each volume, a batch of volumes per pass,
and queue shard repairs (through mqproxy) for shards some units lack. A blob with fewer than N shards left
cannot be repaired: it is logged as LOST and counted. The cursor (the last volume inspected) is kept in
clustermgr's kv, so a new scheduler goes on where the last one stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Set

from blobstore_server.libs.ec import tactic
from blobstore_server.libs.proto.blobnode import IOClass
from blobstore_server.libs.proto.cluster import VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.mqproxy import MAX_BATCH, RepairIn
from blobstore_server.libs.proto.scheduler import InspectStats
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.mqproxy.client import MqProxyClient
from blobstore_server.services.scheduler.mirror import VolumeMirror
from blobstore_server.services.scheduler.rules import InspectFinding, inspect_volume

log = logging.getLogger(__name__)
CHECKPOINT_KEY = "volume_inspect/checkpoint"


class VolumeInspector:
    def __init__(self, cluster: ClusterClient, volumes: VolumeMirror, blobnodes: BlobnodeClient, mq: MqProxyClient,
                 batch: int, confirm_after: float) -> None:
        self.cluster, self.volumes, self.blobnodes, self.mq = cluster, volumes, blobnodes, mq
        self.batch, self.confirm_after = batch, confirm_after
        self.stats = InspectStats()

    async def one_pass(self, busy: Set[int]) -> None:
        """Inspect the next batch of volumes after the cursor (not locked, none of `busy`, which tasks are
        moving), then move the cursor; past the last volume it starts over. What a first look finds is looked
        at again `confirm_after` seconds later, and only what both looks found counts: a blob still being
        written is not missing anything."""
        raw = await self.cluster.kv_get(CHECKPOINT_KEY)
        after = int(raw) if raw and raw.isdigit() else 0
        volumes = sorted((v for v in (await self.volumes.refresh()).values() if v.vid > after), key=lambda v: v.vid)
        batch = volumes[:self.batch]
        first = {}
        for volume in batch:
            if volume.status is not VolumeStatus.LOCK and volume.vid not in busy and not volume.pending_units:
                finding = await self._look(volume)
                if finding is not None and (finding.repairs or finding.lost):
                    first[volume.vid] = (volume, finding)
        if first:
            await asyncio.sleep(self.confirm_after)
        for volume, finding in first.values():
            again = await self._look(volume)
            if again is not None:
                await self._act(volume, _both(finding, again))
        await self.cluster.kv_set(CHECKPOINT_KEY, str(batch[-1].vid if batch else 0))
        if len(volumes) <= self.batch:
            self.stats.passes += 1

    async def _look(self, volume: VolumeInfo) -> InspectFinding | None:
        try:
            listings = await asyncio.gather(*(
                self.blobnodes.list_all_shards(u.host, u.disk_id, u.vuid, io_class=IOClass.BACKGROUND)
                for u in volume.units))
        except RpcError as exc:  # a unit that cannot be listed says nothing about what is missing
            log.info("volume %d not inspected: %s", volume.vid, exc)
            return None
        self.stats.volumes += 1
        return inspect_volume([{bid: s.status for bid, s in listing.items()} for listing in listings],
                              tactic(volume.code_mode).n)

    async def _act(self, volume: VolumeInfo, finding: InspectFinding) -> None:
        n = tactic(volume.code_mode).n
        for bid in finding.lost:
            log.error("LOST blob %d/%d: fewer than %d shards on the volume's units", volume.vid, bid, n)
        self.stats.lost_blobs += len(finding.lost)
        messages = [RepairIn(vid=volume.vid, bid=bid, bad_indexes=missing, reason="volume inspect",
                             priority=len(missing) > 1) for bid, missing in finding.repairs.items()]
        for start in range(0, len(messages), MAX_BATCH):
            await self.mq.send_repair(messages[start:start + MAX_BATCH])
        self.stats.repairs_queued += len(messages)
        if messages or finding.lost:
            log.warning("volume %d: %d blobs missing shards (repairs queued), %d lost", volume.vid, len(messages),
                        len(finding.lost))


def _both(first: InspectFinding, second: InspectFinding) -> InspectFinding:
    """What two looks at a volume agree on."""
    repairs = {bid: both for bid, missing in second.repairs.items()
               if bid in first.repairs and (both := sorted(set(missing) & set(first.repairs[bid])))}
    return InspectFinding(repairs, sorted(set(first.lost) & set(second.lost)))
