"""The I/O of a move's check (`moves` decides): the volume's units and the destination listed a window of bids at a
time (a 16 GiB chunk of small blobs lists millions: clustermgr holds one page per unit, never whole lists), then the
blobs the move names lost read back from the other units."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from blobstore_server.libs.ec import tactic
from blobstore_server.libs.proto.blobnode import IOClass, ShardInfo
from blobstore_server.libs.proto.cluster import Unit, VolumeInfo
from blobstore_server.libs.rpc.errors import ChunkNotFound, Conflict, RpcError, Unavailable
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr import moves

PAGE = 10_000  # bids per unit and window
READS = 16  # lost claims checked at once


async def check_destination(blobnodes: BlobnodeClient, volume: VolumeInfo, index: int, destination: Unit,
                            lost: set[int], timeout: float) -> None:
    """Conflict unless `destination` holds every blob unit `index` owes but those of `lost` found lost here;
    Unavailable when the destination cannot be listed."""
    n = tactic(volume.code_mode).n
    unclaimed, claimed = await _missing(blobnodes, volume, index, destination, lost, n, timeout)
    limit = asyncio.Semaphore(READS)

    async def good(bid: int) -> int:
        async with limit:
            return await _good_shards(blobnodes, [u for i, u in enumerate(volume.units) if i != index], bid, timeout)

    good_shards = dict(zip(claimed, await asyncio.gather(*(good(bid) for bid in claimed)), strict=True))
    refuted = moves.unexcused(claimed, lost, good_shards, n)
    short = len(unclaimed) + len(refuted)
    if short:
        raise Conflict(f"volume {volume.vid} unit {index}: the destination {destination.vuid} on disk "
                       f"{destination.disk_id} lacks {short} blobs the unit holds (first bids "
                       f"{sorted([*unclaimed[:5], *refuted[:5]])[:5]}); not switched")


async def _missing(blobnodes: BlobnodeClient, volume: VolumeInfo, index: int, destination: Unit, lost: set[int],
                   n: int, timeout: float) -> tuple[list[int], list[int]]:
    silent: set[int] = set()  # units that did not answer once: not waited for again, window after window

    async def pages(start: int) -> tuple[list[list[ShardInfo] | None], list[ShardInfo]]:
        units = list(await asyncio.gather(*(_page(blobnodes, u, start, timeout) if i not in silent else _none()
                                            for i, u in enumerate(volume.units))))
        silent.update(i for i, page in enumerate(units) if page is None)
        return units, await _destination_page(blobnodes, destination, start, timeout)

    return await moves.missing(pages, index, lost, n, PAGE)


async def _list(blobnodes: BlobnodeClient, unit: Unit, start: int, timeout: float) -> list[ShardInfo]:
    return await asyncio.wait_for(blobnodes.list_shards(unit.host, unit.disk_id, unit.vuid, start, PAGE,
                                                        io_class=IOClass.BACKGROUND), timeout)


async def _page(blobnodes: BlobnodeClient, unit: Unit, start: int, timeout: float) -> list[ShardInfo] | None:
    """The unit's next page from `start`; None when it cannot answer (it vouches for nothing)."""
    try:
        return await _list(blobnodes, unit, start, timeout)
    except (RpcError, TimeoutError):
        return None


async def _none() -> None:
    return None


async def _destination_page(blobnodes: BlobnodeClient, unit: Unit, start: int, timeout: float) -> list[ShardInfo]:
    try:
        return await _list(blobnodes, unit, start, timeout)
    except ChunkNotFound:
        return []  # never created: it holds nothing, which is enough only for a volume holding nothing
    except (RpcError, TimeoutError) as exc:
        raise Unavailable(f"cannot list the destination {unit.vuid} on disk {unit.disk_id}: {exc!r}") from None


async def _good_shards(blobnodes: BlobnodeClient, units: Sequence[Unit], bid: int, timeout: float) -> int:
    """How many of `units` give back their shard of `bid` whole (a blobnode checks each block's CRC as it reads)."""
    async def intact(unit: Unit) -> bool:
        try:
            await blobnodes.get_shard(unit.host, unit.disk_id, unit.vuid, bid, timeout=timeout,
                                      io_class=IOClass.BACKGROUND)
        except RpcError:
            return False
        return True

    return sum(await asyncio.gather(*(intact(u) for u in units)))
