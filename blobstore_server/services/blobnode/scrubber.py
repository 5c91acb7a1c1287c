"""Scrubbing's async shell (the decisions are `services/blobnode/scrub.py`): one loop per disk reads its shards
as background I/O of the disk, at the pace `scrub.pause` sets, and keeps its record in `<disk>/.sys/scrub.json`;
one loop hands the findings' repairs to mqproxy, again and again until it takes them. Between passes it looks at
the disk's stored bytes now and then, so what it shows of the next pass (is the cap enough?) follows the disk.

A read goes through the blobnode's own shard read in the background class: it waits for a background slot of
the disk and is charged against the disk's background rate, on the disk's background threads, so user I/O never
queues behind it. The record is rewritten in place (write, rename) from the event loop without fsync, like an
inline put: a crash may lose its last update, which costs re-reading a few shards, or finding again a shard
that is still corrupt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from isal.isal_zlib import crc32
from pydantic import ValidationError

from blobstore_server.libs.chunkfile import ShardStatus
from blobstore_server.libs.proto.blobnode import MOVED_ERRORS, IOClass, ScrubStat, ShardState, shard_state
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.libs.rpc.server import Lifecycle
from blobstore_server.services.blobnode.node import Blobnode
from blobstore_server.services.blobnode.scrub import ScrubRecord, ScrubState, pause
from blobstore_server.services.mqproxy.client import MqProxyClient

RECORD = Path(".sys") / "scrub.json"
PAGE = 1000  # shards listed per trip to the disk
SAVE_EVERY = 10.0  # seconds between saves of the cursor while a pass reads (a restart re-reads at most this much)
FIRST_RETRY, LAST_RETRY = 1.0, 60.0  # pauses after mqproxy refused, or a pass failed
FORECAST_EVERY = 60.0  # seconds between looks at the disk's stored bytes while the next pass waits
BACKGROUND = IOClass.BACKGROUND
MB = 1 << 20

log = logging.getLogger(__name__)


def load_record(path: Path) -> ScrubRecord:
    """The disk's record; a fresh one if there is none, or it is damaged (the scrub then starts over)."""
    try:
        return ScrubRecord.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return ScrubRecord()
    except (OSError, ValidationError) as exc:
        log.warning("scrub record %s unreadable, starting over: %s", path, exc)
        return ScrubRecord()


class DiskScrubber:
    """One disk's scrub: its state, the file it is kept in, and the loop of passes."""

    def __init__(self, node: Blobnode, disk_id: int, owed: asyncio.Event) -> None:
        self.node = node
        self.disk_id = disk_id
        self.path = node.disk(disk_id).path / RECORD
        self.state = ScrubState(load_record(self.path))
        self.owed = owed  # set when findings wait for mqproxy
        self.room = asyncio.Event()  # set when mqproxy took findings
        self.remaining = 0  # bytes the pass has left to read (between passes: the next one's), as last seen
        self._saved = 0.0

    def save(self) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp")
        try:
            tmp.write_bytes(self.state.record.model_dump_json().encode())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("disk %d: scrub record not saved: %s", self.disk_id, exc)
        self._saved = time.monotonic()

    def stat(self) -> ScrubStat:
        config = self.node.config
        return self.state.stat(self.remaining, config.scrub_period, config.scrub_mb_per_sec * MB, time.time())

    async def run(self) -> None:
        """Pass after pass; a pass that fails (the disk refused a listing) resumes at its cursor a little later."""
        while True:
            try:
                await self._one_pass()
            except RpcError as exc:
                log.warning("disk %d: scrub pass interrupted, resuming later: %s", self.disk_id, exc)
                self.save()
                await asyncio.sleep(LAST_RETRY)

    async def _stored(self, from_vuid: int = 0) -> int:
        return await asyncio.to_thread(self.node.disk(self.disk_id).stored_bytes, from_vuid)

    async def _one_pass(self) -> None:
        while (wait := self.state.wait(time.time(), self.node.config.scrub_period)) > 0:
            self.remaining = await self._stored()
            await asyncio.sleep(min(wait, FORECAST_EVERY))
        self.state.begin(time.time())
        self.save()
        for chunk in sorted(await self.node.list_chunks(self.disk_id), key=lambda c: c.vuid):
            cursor = self.state.record
            if chunk.vuid >= cursor.vuid:
                await self._chunk(chunk.vuid, cursor.bid if chunk.vuid == cursor.vuid else 0)
        self.state.finish(time.time())
        self.save()
        r = self.state.record
        log.info("disk %d: scrub pass %d done: %d shards, %.1f MiB in %.0f s", self.disk_id, r.passes,
                 r.pass_shards, r.pass_bytes / MB, r.last_full_pass - r.pass_started)

    async def _chunk(self, vuid: int, start: int) -> None:
        config = self.node.config
        ahead = await self._stored(vuid)  # this chunk's bytes and the later chunks'
        read = 0
        while True:
            try:
                async with self.node.background(self.disk_id, BACKGROUND):
                    shards = await self.node.list_shards(self.disk_id, vuid, start, PAGE, ShardStatus.NORMAL,
                                                         BACKGROUND)
            except MOVED_ERRORS:  # released, or a newer epoch took the unit, since the chunks were listed
                break
            for meta in shards:
                while self.state.full:
                    self.room.clear()
                    await self.room.wait()
                self.remaining = max(ahead - read, meta.size)
                began = time.time()
                pace = self.state.pace(self.remaining, config.scrub_period, config.scrub_mb_per_sec * MB, began)
                found = await self._read(vuid, meta.bid)
                read += meta.size
                finding = self.state.scrubbed(vuid, meta.bid, meta.size, found, time.time())
                if finding is not None:
                    log.error("disk %d: scrub found shard %d of vuid %d %s: repair owed", self.disk_id, meta.bid,
                              vuid, finding.reason)
                    self.owed.set()
                if finding is not None or time.monotonic() - self._saved > SAVE_EVERY:
                    self.save()
                await asyncio.sleep(pause(meta.size, pace, time.time() - began))
            if len(shards) < PAGE:
                break
            start = shards[-1].bid + 1
        self.state.chunk_done(vuid)
        self.save()

    async def _read(self, vuid: int, bid: int) -> ShardState:
        """Read the whole shard (every block's CRC is checked on the way) and compare its CRC with the index's.
        An internal error is tried once more: a chunk compacted away under the read fails like that, once."""
        state = ShardState.ERROR
        for _ in range(2):
            try:
                async with self.node.background(self.disk_id, BACKGROUND):
                    meta, _, pieces = await self.node.open_shard_read(self.disk_id, vuid, bid, 0, None, BACKGROUND)
                    crc = 0
                    async for piece in pieces:
                        crc = crc32(piece, crc)
            except RpcError as exc:
                state = shard_state(exc)
            else:
                state = ShardState.PRESENT if crc == meta.crc else ShardState.CORRUPT
            if state is not ShardState.ERROR:
                break
        return state

    async def send(self, mq: MqProxyClient) -> bool:
        """Hand every owed repair to mqproxy; False if it refused (they stay owed)."""
        taken = list(self.state.record.owed)
        if not taken:
            return True
        try:
            await mq.send_repair([f.repair() for f in taken])
        except RpcError as exc:
            log.warning("disk %d: mqproxy did not take %d scrub repair(s), trying again: %s", self.disk_id,
                        len(taken), exc)
            return False
        self.state.queued(taken)
        self.room.set()
        self.save()
        return True


class Scrubber:
    """Every disk's scrub (none with `scrub_period` 0), and, given mqproxy, the loop that queues their repairs.
    Without mqproxy (a blobnode without clustermgr) findings are logged and kept, never sent."""

    def __init__(self, node: Blobnode, mq: MqProxyClient | None) -> None:
        self.owed = asyncio.Event()
        self.disks = {disk_id: DiskScrubber(node, disk_id, self.owed) for disk_id in sorted(node.disks)}
        self.mq = mq
        self.life = Lifecycle()
        if node.config.scrub_period > 0:
            for scrub in self.disks.values():
                self.life.loop(scrub.run)
            self.life.close(self._save_all)
        if mq is not None:
            self.life.loop(self._send)
            self.life.close(mq.close)
        if any(scrub.state.record.owed for scrub in self.disks.values()):
            self.owed.set()

    def stat(self, disk_id: int) -> ScrubStat:
        return self.disks[disk_id].stat()

    async def _save_all(self) -> None:
        """On the way down: every cursor where it stopped, so a restart resumes there."""
        for scrub in self.disks.values():
            scrub.save()

    async def _send(self) -> None:
        assert self.mq is not None
        retry = FIRST_RETRY
        while True:
            await self.owed.wait()
            self.owed.clear()
            sent = [await scrub.send(self.mq) for scrub in self.disks.values()]
            if all(sent):
                retry = FIRST_RETRY
                continue
            self.owed.set()
            await asyncio.sleep(retry)
            retry = min(retry * 2, LAST_RETRY)
