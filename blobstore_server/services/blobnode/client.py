"""Typed async client of the blobnode API, used by access, workers, the CLI and the tests.

One client talks to every blobnode (the host is an argument of each call) over one shared
connection pool, because an access PUT fans out to N+M of them at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from isal.isal_zlib import crc32

from blobstore_server.libs.proto import blobnode as api
from blobstore_server.libs.proto.blobnode import (
    BATCH_SEPARATOR,
    IO_CLASS_PARAM,
    MAX_BATCH,
    ChunkChange,
    ChunkCreate,
    ChunkInfo,
    ChunkRef,
    ChunkRelease,
    ChunkStat,
    DiskStat,
    ExportRequest,
    ExportResult,
    IOClass,
    NodeStat,
    ShardDelete,
    ShardDiscard,
    ShardFailure,
    ShardGetBatchHead,
    ShardInfo,
    ShardRef,
    ShardStatusResult,
    TaskFenceChange,
)
from blobstore_server.libs.proto.messages import DeleteIntent
from blobstore_server.libs.rpc.auth import CRC_PARAM
from blobstore_server.libs.rpc.client import HttpClient, Payload, ServiceClient, presigned
from blobstore_server.libs.rpc.coalesce import Coalescer
from blobstore_server.libs.rpc.errors import Internal, RpcError, Unavailable, Unreachable, error_from_response
from blobstore_server.libs.rpc.lean import LeanTransport
from blobstore_server.libs.rpc.routes import Route
from blobstore_server.libs.rpc.splice import BodySpan

Params = dict[str, str | int]
T = TypeVar("T")
BATCHED_SHARD_BYTES = 64 << 10  # larger shards go one per request: their bytes, not the request, dominate
BATCH_BYTES = 1 << 20  # at most this many shard bytes in one batch


@dataclass(frozen=True)
class _ShardPut:
    disk_id: int
    vuid: int
    bid: int
    data: bytes | bytearray | memoryview
    crc: int
    timeout: float | None
    io_class: IOClass

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class _ShardGet:
    disk_id: int
    vuid: int
    bid: int
    offset: int
    size: int | None
    timeout: float | None
    io_class: IOClass


def _listed(calls: Sequence[_ShardPut | _ShardGet], *names: str) -> Params:
    """A batch's query: for each name (the CRC's is `crc`), every call's value in order."""
    # int(): a Vuid prints as more than its digits
    return {name: BATCH_SEPARATOR.join([str(int(getattr(call, name))) for call in calls]) for name in names}


def _longest(calls: Sequence[_ShardPut | _ShardGet]) -> float | None:
    timeouts = [call.timeout for call in calls if call.timeout is not None]
    return max(timeouts) if timeouts else None


async def _within(timeout: float | None, host: str, call: Awaitable[T]) -> T:
    """`call`, a coalesced one, which fails within its `timeout` (the coalescer's timer while it waits for a batch,
    the request's own once sent alone) as a plain call does."""
    try:
        return await call
    except TimeoutError:
        raise Unreachable(f"{host}: no answer within {timeout} s") from None


def _batch_outcomes(host: str, reads: list[_ShardGet], head_line: memoryview, available: int,
                    cut: Callable[[int, int], T]) -> list[T | BaseException]:
    """Each read's outcome from a batched answer: its head line, then the `available` bytes of the shards read,
    one after another, each cut out by `cut(start, length)`."""
    end = bytes(head_line[:64 << 10]).find(b"\n")
    head = ShardGetBatchHead.model_validate_json(bytes(head_line[:end])) if end >= 0 else None
    if head is None or len(head.shards) != len(reads):
        raise Internal(f"{host} answered a batched read without a head for its {len(reads)} ranges")
    outcomes: list[T | BaseException] = []
    start = 0
    for outcome in head.shards:
        if outcome.failure is not None:
            outcomes.append(_failed(outcome.failure))
            continue
        outcomes.append(cut(start, outcome.length))
        start += outcome.length
    if start != available:
        raise Internal(f"{host} answered {available} bytes for ranges of {start}")
    return outcomes


def _whole_batch(host: str, reads: list[_ShardGet], answer: memoryview) -> list[Payload | BaseException]:
    body = answer[bytes(answer[:64 << 10]).find(b"\n") + 1:]
    return _batch_outcomes(host, reads, answer, len(body), lambda start, length: body[start:start + length])


def _failed(failure: ShardFailure | None) -> RpcError:
    """The typed error one shard of a batch met, as a single call would have raised it."""
    failure = failure or ShardFailure(status=500, code="internal", error="the blobnode named no outcome")
    return error_from_response(failure.status, {"code": failure.code, "error": failure.error})


def _with_class(params: Params, io_class: IOClass) -> Params:
    """User I/O goes without the parameter (the blobnode's default); background I/O names itself."""
    if io_class is not IOClass.USER:
        params[IO_CLASS_PARAM] = io_class.value
    return params


class BackgroundReaders:
    """Where each blobnode's background reader listens (its /stat's `background_host`): background reads go
    there. A node without one yet (it starts on the node's first background read) is asked again `recheck`
    seconds later; a reader that fails to answer is forgotten, and the read goes to the node itself."""

    def __init__(self, stat: Callable[[str], Awaitable[NodeStat]], recheck: float = 0.5) -> None:
        self._stat = stat
        self.recheck = recheck
        self._known: dict[str, tuple[str, float]] = {}  # node -> (its reader or "", when asked)

    async def of(self, host: str) -> str:
        """The reader's URL for node `host`, "" for the node itself."""
        known = self._known.get(host)
        now = time.monotonic()
        if known is not None and (known[0] or now - known[1] < self.recheck):
            return known[0]
        self._known[host] = ("", now)  # reads meanwhile go to the node: one question at a time
        try:
            url = (await self._stat(host)).background_host
        except RpcError:
            url = ""
        self._known[host] = (url, time.monotonic())
        return url

    def forget(self, host: str) -> None:
        self._known[host] = ("", time.monotonic())


class BlobnodeClient(ServiceClient):
    """Shard puts and whole-shard gets go over the lean transport (`libs.rpc.lean`), the rest over aiohttp."""

    def __init__(self, http: HttpClient | None = None, timeout: float = 30.0, shards: HttpClient | None = None,
                 in_flight: int = 0) -> None:
        """`in_flight` > 0: small user shard puts (reads) to one blobnode beyond that many puts (reads) on their
        way ride together in `/shard/put_batch` (`/shard/get_batch`) requests (`libs.rpc.coalesce`); 0: every
        put and read is its own request."""
        super().__init__(api.ROUTES, http, timeout)
        self.shards = shards or HttpClient(LeanTransport(timeout=timeout), routes=api.ROUTES)
        self._puts = self._gets = None
        if in_flight > 0:
            self._puts = Coalescer(self._put_one, self._put_many, size=lambda put: len(put.data),
                                   in_flight=in_flight, max_items=MAX_BATCH, max_bytes=BATCH_BYTES,
                                   timeout=lambda put: put.timeout)
            self._gets = Coalescer(self._get_one, self._get_many, size=lambda get: get.size or 0,
                                   in_flight=in_flight, max_items=MAX_BATCH, max_bytes=BATCH_BYTES,
                                   timeout=lambda get: get.timeout)
        self.readers = BackgroundReaders(self.stat)

    async def close(self) -> None:
        await self.shards.close()
        await super().close()

    # chunks

    # A scheduler names the epoch of its lease (`scheduler_epoch`) in every chunk state change it sends, with
    # clustermgr's ticket for it (`epoch_ticket`): each disk refuses one older than the newest it has seen
    # (`ChunkChange`).

    async def create_chunk(self, host: str, disk_id: int, vuid: int, chunk_size: int | None = None,
                           timeout: float | None = None, scheduler_epoch: int | None = None,
                           epoch_ticket: str | None = None) -> ChunkInfo:
        body = ChunkCreate(disk_id=disk_id, vuid=vuid, chunk_size=chunk_size, scheduler_epoch=scheduler_epoch,
                           epoch_ticket=epoch_ticket)
        return await self.http.call_route(api.CHUNK_CREATE, host, body=body, timeout=timeout)

    async def _chunk_op(self, host: str, route: Route[ChunkInfo], body: ChunkRef,
                        timeout: float | None = None) -> ChunkInfo:
        return await self.http.call_route(route, host, body=body, timeout=timeout)

    async def release_chunk(self, host: str, disk_id: int, vuid: int, timeout: float | None = None,
                            scheduler_epoch: int | None = None, ticket: str | None = None,
                            epoch_ticket: str | None = None) -> ChunkInfo:
        """`ticket`: clustermgr's release ticket for this chunk, which a blobnode with auth requires."""
        body = ChunkRelease(disk_id=disk_id, vuid=vuid, scheduler_epoch=scheduler_epoch, ticket=ticket,
                            epoch_ticket=epoch_ticket)
        return await self._chunk_op(host, api.CHUNK_RELEASE, body, timeout)

    async def set_chunk_readonly(self, host: str, disk_id: int, vuid: int, readonly: bool = True,
                                 timeout: float | None = None, scheduler_epoch: int | None = None,
                                 epoch_ticket: str | None = None) -> ChunkInfo:
        body = ChunkChange(disk_id=disk_id, vuid=vuid, scheduler_epoch=scheduler_epoch, epoch_ticket=epoch_ticket)
        return await self._chunk_op(host, api.CHUNK_READONLY if readonly else api.CHUNK_READWRITE, body, timeout)

    async def set_task_fence(self, host: str, disk_id: int, vuid: int, scheduler_epoch: int, token: int | None,
                             timeout: float | None = None, epoch_ticket: str | None = None) -> ChunkInfo:
        """Open the chunk's task fence at `token` (a task's hand-out), or close it for good (None): `TaskFence`."""
        body = TaskFenceChange(disk_id=disk_id, vuid=vuid, scheduler_epoch=scheduler_epoch, token=token,
                               epoch_ticket=epoch_ticket)
        return await self._chunk_op(host, api.CHUNK_TASK_FENCE, body, timeout)

    async def compact_chunk(self, host: str, disk_id: int, vuid: int) -> ChunkInfo:
        return await self._chunk_op(host, api.CHUNK_COMPACT, ChunkRef(disk_id=disk_id, vuid=vuid))

    async def list_chunks(self, host: str, disk_id: int) -> list[ChunkInfo]:
        return (await self.http.call_route(api.CHUNK_LIST, host, params={"disk_id": disk_id})).chunks

    async def chunk_stat(self, host: str, disk_id: int, vuid: int) -> ChunkStat:
        return await self.http.call_route(api.CHUNK_STAT, host, params={"disk_id": disk_id, "vuid": vuid})

    # shards

    async def put_shard(self, host: str, disk_id: int, vuid: int, bid: int,
                        data: bytes | bytearray | memoryview, timeout: float | None = None,
                        io_class: IOClass = IOClass.USER) -> int:
        """Store one shard; returns its CRC32 once the blobnode holds it durably."""
        put = _ShardPut(disk_id, vuid, bid, data, crc32(data), timeout, io_class)
        if self._puts is not None and io_class is IOClass.USER and len(data) <= BATCHED_SHARD_BYTES:
            return await _within(put.timeout, host, self._puts.call(host, put))
        return await self._put_one(host, put)

    async def _put_one(self, host: str, put: _ShardPut) -> int:
        # the CRC goes in the signed query: the blobnode refuses bytes that do not match it
        params = _with_class({"disk_id": put.disk_id, "vuid": put.vuid, "bid": put.bid, "size": len(put.data),
                              CRC_PARAM: put.crc}, put.io_class)
        answer = await self.shards.call_route(api.SHARD_PUT, host, params=params, data=put.data, timeout=put.timeout)
        return answer.crc

    async def _put_many(self, host: str, puts: list[_ShardPut]) -> list[int | BaseException]:
        params = _listed(puts, "disk_id", "vuid", "bid", "size", CRC_PARAM)
        answer = await self.shards.call_route(api.SHARD_PUT_BATCH, host, params=params,
                                              data=b"".join(p.data for p in puts), timeout=_longest(puts))
        if len(answer.shards) != len(puts):
            raise Internal(f"{host} answered {len(answer.shards)} outcomes for a batch of {len(puts)} shards")
        return [outcome.stored.crc if outcome.stored is not None else _failed(outcome.failure)
                for outcome in answer.shards]

    @staticmethod
    def _get_params(disk_id: int, vuid: int, bid: int, offset: int, size: int | None, io_class: IOClass) -> Params:
        params: Params = {"disk_id": disk_id, "vuid": vuid, "bid": bid, "offset": offset}
        if size is not None:
            params["size"] = size
        return _with_class(params, io_class)

    async def get_shard(self, host: str, disk_id: int, vuid: int, bid: int, offset: int = 0,
                        size: int | None = None, timeout: float | None = None,
                        io_class: IOClass = IOClass.USER) -> Payload:
        """Read a shard or a range of it; corrupted bytes come back as `ShardCorrupted`, never data."""
        read = _ShardGet(disk_id, vuid, bid, offset, size, timeout, io_class)
        if self._gets is not None and io_class is IOClass.USER and size is not None and size <= BATCHED_SHARD_BYTES:
            return await _within(read.timeout, host, self._gets.call(host, read))
        if io_class is IOClass.BACKGROUND:
            reader = await self.readers.of(host)
            if reader:
                try:
                    return await self._get_one(reader, read)
                except Unavailable:
                    self.readers.forget(host)
        return await self._get_one(host, read)

    async def get_shards(self, host: str, disk_id: int, vuid: int, ranges: Sequence[tuple[int, int, int]],
                         timeout: float | None = None, deferred: bool = False
                         ) -> Sequence[Payload | BodySpan | BaseException]:
        """Ranges (bid, offset, size) of user shards of one unit in one `/shard/get_batch` request, each with its
        own outcome (its bytes or the typed error); at most `MAX_BATCH` of them, `MAX_BATCH_BYTES` in all.
        `deferred`: the bytes may stay in the connection's socket, as spans of one `SocketBody` to move on in
        order and then finish (`libs.rpc.lean`)."""
        reads = [_ShardGet(disk_id, vuid, bid, offset, size, timeout, IOClass.USER) for bid, offset, size in ranges]
        if not deferred:
            return await self._get_many(host, reads)
        received, rest = await self.shards.request_deferred(
            api.SHARD_GET_BATCH.method, f"{host}{api.SHARD_GET_BATCH.path}",
            params=_listed(reads, "disk_id", "vuid", "bid", "offset", "size"), timeout=_longest(reads))
        if rest is None:
            return _whole_batch(host, reads, memoryview(received))
        try:
            return _batch_outcomes(host, reads, memoryview(received), rest.length, rest.span)
        except BaseException:
            rest.finish()
            raise

    def presigned_get(self, host: str, disk_id: int, vuid: int, bid: int, offset: int, size: int
                      ) -> tuple[str, dict[str, str]]:
        """A user read of a shard's range, signed for a client to send itself once (`ReadPlan`): its URL and
        headers."""
        return presigned(api.SHARD_GET.method, f"{host}{api.SHARD_GET.path}",
                         self._get_params(disk_id, vuid, bid, offset, size, IOClass.USER), api.ROUTES)

    async def _get_one(self, host: str, read: _ShardGet) -> Payload:
        params = self._get_params(read.disk_id, read.vuid, read.bid, read.offset, read.size, read.io_class)
        return await self.shards.request(api.SHARD_GET.method, f"{host}{api.SHARD_GET.path}", params=params,
                                         timeout=read.timeout)

    async def _get_many(self, host: str, reads: list[_ShardGet]) -> list[Payload | BaseException]:
        params = _listed(reads, "disk_id", "vuid", "bid", "offset", "size")
        answer = await self.shards.request(api.SHARD_GET_BATCH.method, f"{host}{api.SHARD_GET_BATCH.path}",
                                           params=params, timeout=_longest(reads))
        return _whole_batch(host, reads, memoryview(answer))

    def stream_shard(self, host: str, disk_id: int, vuid: int, bid: int, offset: int = 0,
                     size: int | None = None, io_class: IOClass = IOClass.USER) -> AsyncIterator[bytes]:
        return self.http.stream(f"{host}{api.SHARD_GET.path}",
                                params=self._get_params(disk_id, vuid, bid, offset, size, io_class))

    async def _shard_op(self, host: str, route: Route[ShardStatusResult], body: ShardRef,
                        io_class: IOClass) -> ShardStatusResult:
        return await self.http.call_route(route, host, body=body, params=_with_class({}, io_class))

    async def mark_delete_shard(self, host: str, disk_id: int, vuid: int, bid: int,
                                io_class: IOClass = IOClass.USER, ticket: str | None = None,
                                intent: DeleteIntent | None = None) -> ShardStatusResult:
        """Mark a shard deleted (reads fail, an undelete lifts it), under tinker's delete `ticket` for it and access's
        `intent` for its blob."""
        body = ShardDelete(disk_id=disk_id, vuid=vuid, bid=bid, ticket=ticket, intent=intent)
        return await self._shard_op(host, api.SHARD_MARK_DELETE, body, io_class)

    async def unmark_delete_shard(self, host: str, disk_id: int, vuid: int, bid: int,
                                  io_class: IOClass = IOClass.USER) -> ShardStatusResult:
        return await self._shard_op(host, api.SHARD_UNMARK_DELETE, ShardRef(disk_id=disk_id, vuid=vuid, bid=bid),
                                    io_class)

    async def delete_shard(self, host: str, disk_id: int, vuid: int, bid: int,
                           io_class: IOClass = IOClass.USER, ticket: str | None = None,
                           intent: DeleteIntent | None = None) -> ShardStatusResult:
        """Delete for good a shard marked deleted at least the blobnode's `delete_hold` ago (Conflict otherwise),
        under tinker's delete `ticket` for it and access's `intent` for its blob."""
        body = ShardDelete(disk_id=disk_id, vuid=vuid, bid=bid, ticket=ticket, intent=intent)
        return await self._shard_op(host, api.SHARD_DELETE, body, io_class)

    async def discard_shard(self, host: str, disk_id: int, vuid: int, bid: int, io_class: IOClass = IOClass.USER,
                            task_token: int | None = None, ticket: str | None = None) -> ShardStatusResult:
        """Delete a shard at once: a repair or migration making room for the right bytes (discard-shard). A task's
        worker names the token of its hand-out (the chunk's task fence refuses a stale one, `TaskFence`) and the
        scheduler's discard `ticket` for it; without a token only a shard failing its checksums goes."""
        body = ShardDiscard(disk_id=disk_id, vuid=vuid, bid=bid, task_token=task_token, ticket=ticket)
        return await self._shard_op(host, api.SHARD_DISCARD, body, io_class)

    async def shard_stat(self, host: str, disk_id: int, vuid: int, bid: int,
                         io_class: IOClass = IOClass.USER) -> ShardInfo:
        params = _with_class({"disk_id": disk_id, "vuid": vuid, "bid": bid}, io_class)
        return await self.http.call_route(api.SHARD_STAT, host, params=params)

    async def list_shards(self, host: str, disk_id: int, vuid: int, start_bid: int = 0, count: int | None = None,
                          status: str | None = None, io_class: IOClass = IOClass.USER) -> list[ShardInfo]:
        params = _with_class({"disk_id": disk_id, "vuid": vuid, "start_bid": start_bid}, io_class)
        if count is not None:
            params["count"] = count
        if status is not None:
            params["status"] = status
        return (await self.http.call_route(api.SHARD_LIST, host, params=params)).shards

    async def list_all_shards(self, host: str, disk_id: int, vuid: int, page: int = 10_000,
                              io_class: IOClass = IOClass.USER) -> dict[int, ShardInfo]:
        """Every shard of a chunk by bid, listed `page` at a time."""
        shards: dict[int, ShardInfo] = {}
        start = 0
        while True:
            listed = await self.list_shards(host, disk_id, vuid, start, page, io_class=io_class)
            shards.update((s.bid, s) for s in listed)
            if len(listed) < page:
                return shards
            start = listed[-1].bid + 1

    # node

    async def disk_stat(self, host: str, disk_id: int) -> DiskStat:
        return await self.http.call_route(api.DISK_STAT, host, params={"disk_id": disk_id})

    async def stat(self, host: str) -> NodeStat:
        return await self.http.call_route(api.STAT, host)

    async def export(self, host: str, target: str, timeout: float | None = None) -> ExportResult:
        """Have every disk of the node write its shard index into `target` (see ExportRequest); returns the
        manifests once all are written."""
        return await self.http.call_route(api.INSPECT_EXPORT, host,
                                    body=ExportRequest(target=target), timeout=timeout)

    async def health(self, host: str, timeout: float = 2.0) -> bool:
        try:
            await self.http.request("GET", f"{host}/health", timeout=timeout)
        except RpcError:
            return False
        return True
