"""Where every shard of an object lives and whether it is intact, asked of clustermgr and the blobnodes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from blobstore.records import Stat
from blobstore_server.libs.proto.blobnode import ShardState, shard_state
from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient

PARALLEL = 16  # shard probes in flight


@dataclass(frozen=True)
class ShardReport:
    """`state`: a `ShardState` (present, missing, corrupt, mark_deleted, unreachable, ...); `detail` says more."""

    vid: int
    bid: int
    index: int
    vuid: int
    disk_id: int
    host: str
    state: str
    detail: str = ""


async def _probe(blobnodes: BlobnodeClient, vid: int, bid: int, index: int, unit: Unit,
                 gate: asyncio.Semaphore) -> ShardReport:
    state, detail = ShardState.PRESENT, ""
    async with gate:
        try:
            info = await blobnodes.shard_stat(unit.host, unit.disk_id, unit.vuid, bid)
            if info.status != "normal":
                state = ShardState(info.status)
            else:
                # Only a full read checks every block's CRC; the blobnode refuses corrupted bytes.
                await blobnodes.get_shard(unit.host, unit.disk_id, unit.vuid, bid)
        except RpcError as exc:
            state, detail = shard_state(exc), f"{exc.code}: {exc.message}"
    return ShardReport(vid, bid, index, unit.vuid, unit.disk_id, unit.host, state.value, detail)


async def inspect_shards(stat: Stat, cluster: ClusterClient, blobnodes: BlobnodeClient) -> list[ShardReport]:
    """One report per shard of every blob of the object, in blob then shard-index order."""
    volumes = {vid: await cluster.get_volume(vid) for vid in sorted({s.vid for s in stat.blobs})}
    gate = asyncio.Semaphore(PARALLEL)
    probes = [_probe(blobnodes, s.vid, bid, index, unit, gate)
              for s in stat.blobs for bid in range(s.min_bid, s.min_bid + s.count)
              for index, unit in enumerate(volumes[s.vid].units)]
    return list(await asyncio.gather(*probes))
