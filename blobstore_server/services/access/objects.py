"""Whole objects: PUT streams the body blob by blob (never the whole object in memory), GET streams
any byte range back, blob by blob."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Collection
from pathlib import Path

from isal import isal_zlib

from blobstore.records import ReadPlan, ShardPiece
from blobstore_server.libs.ec import CodeMode, codec_for, tactic
from blobstore_server.libs.proto.allocator import BlobSlice
from blobstore_server.libs.proto.blobnode import MAX_BATCH, MAX_BATCH_BYTES
from blobstore_server.libs.proto.clustermgr import CodeModePolicy
from blobstore_server.libs.proto.location import Location, SliceInfo
from blobstore_server.libs.proto.messages import UploadSlice
from blobstore_server.libs.proto.mqproxy import DeleteIn, RepairIn
from blobstore_server.libs.proto.uploads import BlobToken
from blobstore_server.libs.rpc.errors import Conflict, LengthMismatch, RpcError, TooLarge, Unavailable
from blobstore_server.services.access.blobs import (
    BlobSpan,
    BlobWrite,
    BlobWriteFailed,
    Sent,
    ShardIO,
    drop_task,
    finish_bodies,
    read_blobs,
    write_blob,
)
from blobstore_server.services.access.config import AccessConfig
from blobstore_server.services.access.deadlines import read_clocks
from blobstore_server.services.access.metrics import (
    PLANNED_BYTES,
    READ_PLANS,
    STANDBY_ALLOCATIONS,
    STANDBY_HELD,
    VOLUME_RETRIES,
)
from blobstore_server.services.access.outbox import Outbox
from blobstore_server.services.access.putplan import PutPlan, RetryRefused
from blobstore_server.services.access.quorum import decide_put
from blobstore_server.services.access.reserve import Reservations
from blobstore_server.services.access.standby import Standby
from blobstore_server.services.access.statefile import SavedGrant, Saving, StateFile, StateFileError, on_disk
from blobstore_server.services.access.stripes import BlobRange, plan_range, plan_runs, shard_reads, split_object
from blobstore_server.services.allocator.client import AllocatorClient
from blobstore_server.services.clustermgr.client import VolumeCache
from blobstore_server.services.mqproxy.client import MqProxyClient

log = logging.getLogger(__name__)
RETRY_AFTER = 5.0  # seconds: what a PUT refused for want of space is told to wait


class BodyReader:
    """Cuts a streamed request body into exact blob-sized pieces and checks its declared length. Each byte is
    copied once, into the piece that holds it: the chunks received are kept as they came and joined (gathering them
    in a bytearray and slicing it out copied every byte three times, a fifth of access's CPU on large PUTs)."""

    def __init__(self, body: AsyncIterator[bytes], declared: int) -> None:
        self._body = body
        self._declared = declared
        self._chunks: deque[bytes | memoryview] = deque()  # received, not yet handed out
        self._held = 0
        self._seen = 0

    async def read(self, n: int) -> bytes:
        while self._held < n:
            chunk = await anext(self._body, None)
            if chunk is None:
                raise LengthMismatch(f"body ended after {self._seen} bytes; Content-Length is {self._declared}")
            self._seen += len(chunk)
            if self._seen > self._declared:
                raise LengthMismatch(f"body is longer than its Content-Length {self._declared}")
            self._chunks.append(chunk)
            self._held += len(chunk)
        parts: list[bytes | memoryview] = []
        need = n
        while need:
            chunk = self._chunks.popleft()
            if len(chunk) > need:  # the piece ends inside this chunk: the rest of it starts the next piece
                self._chunks.appendleft(memoryview(chunk)[need:])
                chunk = memoryview(chunk)[:need]
            parts.append(chunk)
            need -= len(chunk)
        self._held -= n
        return b"".join(parts)

    async def finish(self) -> None:
        async for chunk in self._body:
            if chunk:
                raise LengthMismatch(f"body is longer than its Content-Length {self._declared}")


class ObjectStore:
    def __init__(self, config: AccessConfig, io: ShardIO, volumes: VolumeCache, allocator: AllocatorClient,
                 state: StateFile, mq: MqProxyClient | None = None, cluster_id: int | None = None) -> None:
        self.config = config
        self.cluster_id = config.cluster_id if cluster_id is None else cluster_id
        self.mq = mq
        self.state = state  # what this node owes and holds, kept across a crash (statefile.py)
        # Repair and leftover-delete messages, kept till sent.
        self.outbox = Outbox(mq, state, self.cluster_id) if mq is not None else None
        self.io = io
        self.volumes = volumes
        self.allocator = allocator
        self.policy = CodeModePolicy([], config.default_code_mode)
        self.reserved = Reservations(config.reserve_bids, config.reserve_bytes, config.reserve_ttl)
        self.standby = Standby(config.standby_ride_out, config.standby_headroom, config.standby_min_bids,
                               config.standby_min_bytes, config.standby_max_bids, config.standby_max_bytes)
        now, clocks = time.monotonic(), read_clocks()
        for saved in state.grants(self.cluster_id):  # those whose time ran out go at the first look, bytes given back
            self.standby.restore(saved.mode, saved.grant(now, clocks))

    def load_policy(self, raw: str | None) -> None:
        """Take the size policy clustermgr publishes (None: none published yet, keep the default)."""
        if raw is not None:
            self.policy = CodeModePolicy(CodeModePolicy.parse(raw), self.policy.default)

    async def put(self, body: AsyncIterator[bytes], size: int, mode: CodeMode | None) -> Location:
        """Write the object blob by blob; a blob that misses its quorum is retried on a fresh allocation
        for the rest of the object (`putplan.py`), its leftovers queued for deletion at once."""
        if size > self.config.max_object_size:
            raise TooLarge(f"object of {size} bytes exceeds the maximum of {self.config.max_object_size}")
        mode = mode or self.policy.mode_for(size)
        reader = BodyReader(body, size)
        blob_size = self.config.blob_size
        lengths = split_object(size, blob_size)
        plan = PutPlan(len(lengths), tries=self.config.put_tries, retry_window=self.config.put_retry_window)
        crc = 0
        written: list[BlobWrite] = []
        reading: asyncio.Task[bytes] | None = None
        try:
            if lengths:
                self.standby.record(mode, len(lengths), size, time.monotonic())
                plan.allocated(await self._allocate_object(mode, size, len(lengths)))
                reading = asyncio.create_task(reader.read(lengths[0]))
            for index in range(len(lengths)):
                assert reading is not None
                data = await reading
                # The next blob arrives from the client while this one is encoded and written.
                reading = asyncio.create_task(reader.read(lengths[index + 1])) if index + 1 < len(lengths) else None
                crc = isal_zlib.crc32(data, crc)
                written.append(await self._write_blob(plan, mode, data, size - index * blob_size))
            await reader.finish()
        except (RpcError, ValueError) as exc:
            self._discard(written, str(exc))
            raise
        finally:
            if reading is not None:
                drop_task(reading)
        return Location(cluster_id=self.cluster_id, code_mode=mode, size=size, blob_size=blob_size,
                        crc=crc, blobs=plan.slices())

    async def _write_blob(self, plan: PutPlan, mode: CodeMode, data: bytes, rest: int) -> BlobWrite:
        """Write one blob where `plan` says, trying again elsewhere while it allows; `rest` is the
        object's bytes from this blob on, what a retry allocates."""
        while True:
            vid, bid = plan.begin(time.monotonic())
            volume = await self.volumes.get(vid)
            try:
                outcome = await write_blob(self.io, codec_for(volume.code_mode, volume.backend), volume, bid, data)
            except BlobWriteFailed as exc:
                self.io.health.punish_volume(vid, time.monotonic())
                self._discard([exc.outcome], str(exc))
                try:
                    plan.failed(time.monotonic())
                except RetryRefused as refused:
                    raise BlobWriteFailed(exc.outcome, f"{exc.reason}; not retried: {refused}") from None
                log.warning("retrying on another volume: %s", exc)
                VOLUME_RETRIES.inc()
                try:
                    plan.allocated(await self._allocate(mode, rest, standby=True))
                except Unavailable as no_space:
                    raise BlobWriteFailed(exc.outcome, f"{exc.reason}; no other volume to retry on: {no_space}"
                                          ) from None
                continue
            plan.written()
            await self._repair_unwritten(outcome)
            return outcome

    async def _repair_unwritten(self, outcome: BlobWrite) -> None:
        """Queue the repair of the shards a write left out, and wait until the message is in the state file: the
        blob is acknowledged with its repair owed, which no crash of this node may forget."""
        if not outcome.missing:
            return
        log.warning("blob %d/%d written without shards %s", outcome.vid, outcome.bid, outcome.failed)
        saving = self._queue_repair(RepairIn(vid=outcome.vid, bid=outcome.bid, bad_indexes=list(outcome.missing),
                                             reason="put could not write these shards"))
        if saving is None:
            return
        try:
            await on_disk(saving)
        except StateFileError as exc:  # it is still sent from memory unless this node dies first
            log.error("the repair of blob %d/%d is not kept across a crash: %s", outcome.vid, outcome.bid, exc)

    async def alloc(self, size: int, mode: CodeMode | None) -> tuple[Location, list[BlobToken]]:
        """Allocate a whole object for a multipart upload: its Location (CRC 0: the bytes are not seen
        in order) and one upload token per blob. Its reclaim is queued at once, due after the tokens
        expire: the delete pipeline then removes the upload unless every blob was written."""
        if size > self.config.max_object_size:
            raise TooLarge(f"object of {size} bytes exceeds the maximum of {self.config.max_object_size}")
        if self.mq is None:
            raise Unavailable("this access node has no mqproxy to queue an unfinished upload's reclaim with")
        mode = mode or self.policy.mode_for(size)
        slices = await self._allocate(mode, size) if size else []
        location = Location(cluster_id=self.cluster_id, code_mode=mode, size=size,
                            blob_size=self.config.blob_size, crc=0,
                            blobs=tuple(SliceInfo(min_bid=s.min_bid, vid=s.vid, count=s.count) for s in slices))
        expiry = int(time.time() + self.config.upload_ttl) + 1
        tokens = [BlobToken(self.cluster_id, vid, bid, location.blob_len(i), expiry)
                  for i, (vid, bid) in enumerate(location.blob_ids())]
        if slices:
            # Due once no token can start a write and one begun just before expiry has ended.
            reclaim_after = expiry - time.time() + 2 * self.config.shard_timeout
            await self.mq.send_delete([DeleteIn(vid=slices[0].vid, bid=slices[0].min_bid, after=reclaim_after,
                                                upload=[UploadSlice(vid=s.vid, min_bid=s.min_bid, count=s.count)
                                                        for s in slices])])
        return location, tokens

    async def put_at(self, blob: BlobToken, body: AsyncIterator[bytes], size: int) -> None:
        """Write the one blob a (verified) upload token names. Writing it again with the same bytes is a
        no-op; with other bytes it is a Conflict. The blob cannot move to another volume (its Location is
        fixed), so a blob that misses its quorum fails with 503 and the client tries again later."""
        if size != blob.size:
            raise LengthMismatch(f"this blob holds {blob.size} bytes; the body has {size}")
        reader = BodyReader(body, size)
        data = await reader.read(size)
        await reader.finish()
        volume = await self.volumes.get(blob.vid)
        try:
            outcome = await write_blob(self.io, codec_for(volume.code_mode, volume.backend), volume, blob.bid, data)
        except BlobWriteFailed as exc:
            if exc.outcome.conflicts:
                raise Conflict(f"blob {blob.vid}/{blob.bid} was already uploaded with other bytes") from None
            self.io.health.punish_volume(blob.vid, time.monotonic())
            raise
        await self._repair_unwritten(outcome)

    async def _allocate_object(self, mode: CodeMode, size: int, blobs: int) -> list[BlobSlice]:
        """Space for a new object: a small one from the mode's reservation (a fresh one when it cannot serve)."""
        if not self.reserved.eligible(size, blobs):
            return await self._allocate(mode, size, standby=True)
        now = time.monotonic()
        excluded, avoided = self.io.health.excluded_volumes(now), self.io.health.avoided_disks(now)
        taken = self.reserved.take(mode, size, now, excluded, avoided)
        if taken is None:
            asked_at = time.monotonic()
            try:
                fresh = await self._allocate(mode, self.config.reserve_bytes, self.config.reserve_bids)
            except Unavailable:  # no volume has a reservation's room left (this object may still fit), or no
                return await self._allocate(mode, size, standby=True)  # allocator answers
            volume = await self.volumes.get(fresh[0].vid)
            self.reserved.add(mode, fresh[0], [u.disk_id for u in volume.units], asked_at)
            taken = self.reserved.take(mode, size, time.monotonic(), excluded, avoided)
            if taken is None:  # its volume is on a disk access avoids: the allocator had nothing better
                return await self._allocate(mode, size, standby=True)
        return [taken]

    async def _allocate(self, mode: CodeMode, size: int, bids: int | None = None, standby: bool = False,
                        exclude_vids: Collection[int] = (), probe: bool = False) -> list[BlobSlice]:
        """Space from an allocator; when none answers and `standby`, from the stock held for that."""
        now = time.monotonic()
        excluded, avoided = self.io.health.excluded_volumes(now), self.io.health.avoided_disks(now)
        try:
            return await self.allocator.alloc(mode, size, self.config.blob_size, [*excluded, *exclude_vids],
                                              avoided, bids, [*self.reserved.returned(), *self.standby.returned()],
                                              probe=probe)
        except Unavailable as exc:
            if not standby:
                raise
            code = tactic(mode)
            taken = self.standby.take(mode, size, len(split_object(size, self.config.blob_size)),
                                      time.monotonic(), excluded, avoided, lambda units: decide_put(code, units).ok)
            if taken is None:
                raise Unavailable(f"{exc}; this access node holds no space to ride that out",
                                  retry_after=RETRY_AFTER) from None
            try:  # before a shard is written on them: a restart must not hand these bids out again
                await on_disk(self._save_standby())
            except StateFileError as not_kept:
                raise Unavailable(f"{exc}; the bids this access node holds cannot be noted as taken: {not_kept}",
                                  retry_after=RETRY_AFTER) from None
            STANDBY_ALLOCATIONS.inc()
            return [taken]

    def _save_standby(self) -> Saving:
        """Write what changed in the standby stock to the state file."""
        kept, dropped = self.standby.changes()
        now, clocks = time.monotonic(), read_clocks()
        return self.state.save_grants(self.cluster_id, [SavedGrant.of(mode, grant, now, clocks)
                                                        for mode, grant in kept], dropped)

    async def refill_standby(self) -> None:
        """Fetch the grants the standby stock misses (see standby.py); also how allocators that stopped
        answering are found back."""
        taken: dict[CodeMode, set[int]] = {}
        for want in self.standby.wanted([self.policy.default], time.monotonic()):
            asked_at = time.monotonic()
            exclude = want.exclude_vids | taken.get(want.mode, set())
            mode = want.mode
            try:
                try:
                    granted = await self._allocate(mode, want.bytes, want.bids, exclude_vids=exclude, probe=True)
                except Unavailable:
                    if not exclude:
                        raise
                    granted = await self._allocate(mode, want.bytes, want.bids, probe=True)  # one volume is all
                volume = await self.volumes.get(granted[0].vid)
            except RpcError as exc:
                log.debug("no standby grant of %s now: %s", mode.name, exc)
                continue
            self.standby.add(want.mode, granted[0], want.bytes, [u.disk_id for u in volume.units], asked_at)
            taken.setdefault(want.mode, set()).add(granted[0].vid)
        for held_mode, held in self.standby.held(time.monotonic()).items():
            for what, value in zip(("bids", "bytes", "seconds"), held, strict=True):
                STANDBY_HELD.labels(held_mode.name, what).set(value)
        self._save_standby()  # not waited for: a grant lost in a crash is only space the allocator gets back late

    def _discard(self, written: list[BlobWrite], reason: str) -> None:
        """Blobs no Location will name: note their shards in the orphan log and queue their deletion."""
        self._record_orphans(written, reason)
        leftovers = [DeleteIn(vid=w.vid, bid=w.bid) for w in written if w.written]
        if leftovers and self.outbox is not None:
            self.outbox.delete(leftovers)

    def _record_orphans(self, written: list[BlobWrite], reason: str) -> None:
        """A failed PUT returns no Location, so nothing can read what it wrote; note the shards for
        the delete pipeline to reclaim."""
        if not written:
            return
        with Path(self.config.orphan_log).open("a") as log_file:
            for outcome in written:
                log_file.write(json.dumps({"time": time.time(), "vid": outcome.vid, "bid": outcome.bid,
                                           "shards": outcome.written, "reason": reason}) + "\n")

    async def read(self, location: Location, offset: int, length: int, deferred: bool = False
                   ) -> AsyncIterator[Sent]:
        """Stream bytes [offset, offset + length) of the object a run of blobs at a time (consecutive blobs of one
        volume, read together by `read_blobs`); the next `read_ahead` blobs are read from the blobnodes while
        those before them go out to the client. `deferred`: runs of several blobs may come as `BodySpan`s, bytes
        still in the blobnodes' answers, for the caller to move on in order (and finish each answer after its
        last span); whatever the caller does not take is finished here."""
        ids = list(location.blob_ids())
        parts = plan_range(location.size, location.blob_size, offset, length)
        per_run = self._blobs_per_run(location)
        runs = plan_runs(parts, [ids[part.blob_index][0] for part in parts], per_run)

        async def read_run(run: list[BlobRange]) -> list[Sent]:
            vid = ids[run[0].blob_index][0]
            volume = await self.volumes.get(vid)
            spans = [BlobSpan(ids[part.blob_index][1], location.blob_len(part.blob_index), part.start, part.end)
                     for part in run]
            results = await read_blobs(self.io, codec_for(location.code_mode, volume.backend), volume, spans,
                                       self.config.hedge_after, deferred)
            for span, result in zip(spans, results, strict=True):
                if result.to_repair():
                    self._queue_repair(RepairIn(vid=vid, bid=span.bid, bad_indexes=result.to_repair(),
                                                reason="get found these shards missing or corrupt"))
            return [piece for result in results for piece in result.data]

        ahead: deque[asyncio.Task[list[Sent]]] = deque()
        started = 0
        runs_ahead = max(1, self.config.read_ahead // per_run)
        pieces: list[Sent] = []

        def read_ahead() -> None:
            nonlocal started
            while started < len(runs) and len(ahead) < runs_ahead:
                ahead.append(asyncio.create_task(read_run(runs[started])))
                started += 1

        try:
            read_ahead()
            while ahead:
                pieces = await ahead[0]
                ahead.popleft()
                read_ahead()
                while pieces:
                    yield pieces.pop(0)
        finally:
            finish_bodies(pieces)
            for task in ahead:
                if task.done() and not task.cancelled() and task.exception() is None:
                    finish_bodies(task.result())
                drop_task(task)

    async def read_plan(self, location: Location, offset: int, length: int) -> ReadPlan | None:
        """Bytes [offset, offset + length) as ranges of data shards, in order, each a request signed for the
        client to send itself (at most `direct_plan_bytes` of them: the client asks again for the rest). None
        when direct reads are off, the range is smaller than `direct_reads_from`, or a data shard it needs is on a
        disk that failed or was slow lately: access then reads around it (degraded) as for any GET."""
        config = self.config
        if config.direct_reads_from == 0 or length < config.direct_reads_from:
            return None
        ids = list(location.blob_ids())
        mode = tactic(location.code_mode)
        now = time.monotonic()
        pieces: list[ShardPiece] = []
        for part in plan_range(location.size, location.blob_size, offset, min(length, config.direct_plan_bytes)):
            vid, bid = ids[part.blob_index]
            volume = await self.volumes.get(vid)
            for read in shard_reads(mode, location.blob_len(part.blob_index), part.start, part.end):
                unit = volume.units[read.shard_index]
                if self.io.health.read_last(unit.disk_id, now):
                    return None
                url, headers = self.io.blobnodes.presigned_get(unit.host, unit.disk_id, unit.vuid, bid,
                                                               read.offset, read.length)
                pieces.append(ShardPiece(url=url, headers=headers, size=read.length))
        plan = ReadPlan(size=sum(piece.size for piece in pieces), pieces=pieces, piece_timeout=config.hedge_after)
        READ_PLANS.inc()
        PLANNED_BYTES.inc(plan.size)
        return plan

    def _blobs_per_run(self, location: Location) -> int:
        """Blobs read together: up to `read_ahead`, as many as one batched read per unit carries; one when shard
        calls are never batched (blobnodes that do not serve batches yet)."""
        if self.config.shard_calls_in_flight == 0:
            return 1
        shard = tactic(location.code_mode).shard_size(min(location.blob_size, location.size) or 1)
        return max(1, min(self.config.read_ahead, MAX_BATCH, MAX_BATCH_BYTES // shard))

    async def delete(self, location: Location) -> int:
        """Queue every blob of the object for deletion; returns once Kafka holds the messages."""
        if self.mq is None:
            raise Unavailable("this access node has no mqproxy to queue deletes with")
        messages = [DeleteIn(vid=vid, bid=bid) for vid, bid in location.blob_ids()]
        if messages:
            await self.mq.send_delete(messages)
        return len(messages)

    def _queue_repair(self, repair: RepairIn) -> Saving | None:
        """Owed to the repair pipeline; the outbox sends it in the background. None without an outbox; else
        done once the message is in the state file."""
        return self.outbox.repair(repair) if self.outbox is not None else None
