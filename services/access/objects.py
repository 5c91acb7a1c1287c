"""Whole objects: PUT streams the body blob by blob (never the whole object in memory), GET streams
any byte range back, blob by blob."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from isal import isal_zlib

from libs.ec import Codec, CodeMode, parse_code_mode
from libs.proto.location import Location, SliceInfo
from libs.rpc.errors import LengthMismatch, RpcError, TooLarge, Unavailable
from services.access.blobs import BlobWriteFailed, ShardIO, read_blob, write_blob
from services.access.config import AccessConfig
from services.access.stripes import plan_range, split_object
from services.access.volumes import VolumeCache
from services.allocator.client import AllocatorClient
from services.mqproxy.client import MqProxyClient

log = logging.getLogger(__name__)


class BodyReader:
    """Cuts a streamed request body into exact blob-sized pieces and checks its declared length."""

    def __init__(self, body: AsyncIterator[bytes], declared: int) -> None:
        self._body = body
        self._declared = declared
        self._buffer = bytearray()
        self._seen = 0

    async def read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = await anext(self._body, None)
            if chunk is None:
                raise LengthMismatch(f"body ended after {self._seen} bytes; Content-Length is {self._declared}")
            self._seen += len(chunk)
            if self._seen > self._declared:
                raise LengthMismatch(f"body is longer than its Content-Length {self._declared}")
            self._buffer += chunk
        piece = bytes(self._buffer[:n])
        del self._buffer[:n]
        return piece

    async def finish(self) -> None:
        async for chunk in self._body:
            if chunk:
                raise LengthMismatch(f"body is longer than its Content-Length {self._declared}")


class CodeModePolicy:
    """Size -> code mode, from clustermgr's published policy (smallest matching max_size wins)."""

    def __init__(self, default: CodeMode) -> None:
        self.default = default
        self.rules: list[tuple[int, CodeMode]] = []

    def load(self, raw: str | None) -> None:
        if raw:
            rules = [(int(r["max_size"]), parse_code_mode(r["code_mode"]))
                     for r in json.loads(raw) if r.get("enable", True)]
            self.rules = sorted(rules, key=lambda r: r[0])

    def mode_for(self, size: int) -> CodeMode:
        return next((mode for max_size, mode in self.rules if size <= max_size), self.default)


class ObjectStore:
    def __init__(self, config: AccessConfig, io: ShardIO, volumes: VolumeCache, allocator: AllocatorClient,
                 mq: MqProxyClient | None = None) -> None:
        self.config = config
        self.mq = mq
        self._background: set[asyncio.Task[None]] = set()
        self.secret = config.secret.encode()
        self.io = io
        self.volumes = volumes
        self.allocator = allocator
        self.policy = CodeModePolicy(parse_code_mode(config.default_code_mode))
        self._codecs: dict[tuple[int, str], Codec] = {}

    def codec(self, mode: int, backend: str) -> Codec:
        key = (mode, backend)
        if key not in self._codecs:
            self._codecs[key] = Codec(mode, backend)
        return self._codecs[key]

    async def put(self, body: AsyncIterator[bytes], size: int, mode: CodeMode | None) -> Location:
        if size > self.config.max_object_size:
            raise TooLarge(f"object of {size} bytes exceeds the maximum of {self.config.max_object_size}")
        mode = mode or self.policy.mode_for(size)
        reader = BodyReader(body, size)
        blob_size = self.config.blob_size
        slices = await self.allocator.alloc(int(mode), size, blob_size) if size else []
        bids = [(s.vid, bid) for s in slices for bid in range(s.min_bid, s.min_bid + s.count)]
        crc = 0
        written = []
        try:
            for (vid, bid), blob_len in zip(bids, split_object(size, blob_size), strict=True):
                data = await reader.read(blob_len)
                crc = isal_zlib.crc32(data, crc)
                volume = await self.volumes.get(vid)
                outcome = await write_blob(self.io, self.codec(volume.code_mode, volume.backend), volume, bid, data)
                written.append(outcome)
                if outcome.failed:
                    log.warning("blob %d/%d written without shards %s", vid, bid, outcome.failed)
                    self._notify("send_repair", [{"vid": vid, "bid": bid, "bad_indexes": sorted(outcome.failed),
                                                  "reason": "put could not write these shards"}])
            await reader.finish()
        except (RpcError, ValueError) as exc:
            if isinstance(exc, BlobWriteFailed):
                written.append(exc.outcome)
            self._record_orphans(written, str(exc))
            self._notify("send_delete", [{"vid": w.vid, "bid": w.bid} for w in written if w.written])
            raise
        return Location(cluster_id=self.config.cluster_id, code_mode=int(mode), size=size, blob_size=blob_size,
                        crc=crc, blobs=tuple(SliceInfo(s.min_bid, s.vid, s.count) for s in slices))

    def _record_orphans(self, written: list, reason: str) -> None:  # type: ignore[type-arg]
        """A failed PUT returns no Location, so nothing can read what it wrote; note the shards for
        the delete pipeline to reclaim."""
        if not written:
            return
        with Path(self.config.orphan_log).open("a") as log_file:
            for outcome in written:
                log_file.write(json.dumps({"time": time.time(), "vid": outcome.vid, "bid": outcome.bid,
                                           "shards": outcome.written, "reason": reason}) + "\n")

    def parse(self, token: str) -> Location:
        return Location.from_token(token, self.secret)

    async def read(self, location: Location, offset: int, length: int) -> AsyncIterator[bytes]:
        """Stream bytes [offset, offset + length) of the object, one blob range at a time."""
        ids = list(location.blob_ids())
        mode = location.code_mode
        for part in plan_range(location.size, location.blob_size, offset, length):
            vid, bid = ids[part.blob_index]
            volume = await self.volumes.get(vid)
            result = await read_blob(self.io, self.codec(mode, volume.backend), vid, bid,
                                     location.blob_len(part.blob_index), part.start, part.end,
                                     self.config.hedge_after)
            if result.to_repair():
                self._notify("send_repair", [{"vid": vid, "bid": bid, "bad_indexes": result.to_repair(),
                                              "reason": "get found these shards missing or corrupt"}])
            yield result.data

    async def delete(self, location: Location) -> int:
        """Queue every blob of the object for deletion; returns once Kafka holds the messages."""
        if self.mq is None:
            raise Unavailable("this access node has no mqproxy to queue deletes with")
        messages = [{"vid": vid, "bid": bid} for vid, bid in location.blob_ids()]
        if messages:
            await self.mq.send_delete(messages)
        return len(messages)

    def _notify(self, method: str, messages: list[dict[str, Any]]) -> None:
        """Hand messages to mqproxy in the background: a request never waits on repair bookkeeping."""
        if self.mq is None or not messages:
            return
        task = asyncio.create_task(self._send(method, messages))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send(self, method: str, messages: list[dict[str, Any]]) -> None:
        try:
            await getattr(self.mq, method)(messages)
        except RpcError as exc:
            log.warning("could not queue %s %s: %s", method, messages, exc)
