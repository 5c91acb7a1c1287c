"""Blobnode HTTP routes. Shard put and get, one shard or a batch, are lean routes (`ShardRoutes`, served by
`libs.rpc.lean_server`: the data path); the rest is FastAPI.

Every shard route takes `io_class` (user when absent): a background request holds one of its disk's
background slots for its whole length (see services/blobnode/iolimit.py)."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Query

from blobstore_server.libs.chunkfile import ShardMeta, ShardStatus
from blobstore_server.libs.proto import blobnode as api
from blobstore_server.libs.proto.blobnode import (
    BATCH_SEPARATOR,
    IO_CLASS_PARAM,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    ChunkChange,
    ChunkCreate,
    ChunkInfo,
    ChunkList,
    ChunkRef,
    ChunkRelease,
    ChunkStat,
    ChunkStatus,
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
    ShardList,
    ShardPutBatchResult,
    ShardPutOutcome,
    ShardPutResult,
    ShardReadOutcome,
    ShardRef,
    ShardStatusResult,
    TaskFenceChange,
)
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.auth import CRC_PARAM
from blobstore_server.libs.rpc.errors import BadRequest, RpcError, TooLarge
from blobstore_server.libs.rpc.lean_server import LeanHandler, Request, Responder
from blobstore_server.libs.rpc.routes import Route
from blobstore_server.libs.rpc.server import WithLeanRoutes, create_app, int_param, serves, with_lean_routes
from blobstore_server.libs.rpc.tickets import Gate, IntentGate, Kind, cluster_host, key_kind
from blobstore_server.services.blobnode.cluster import ClusterLink
from blobstore_server.services.blobnode.node import Blobnode, ShardRead, ShardWrite, ready, shard_info
from blobstore_server.services.blobnode.reader_process import ReaderProcess
from blobstore_server.services.blobnode.scrubber import Scrubber
from blobstore_server.services.blobnode.upkeep import Upkeep

JOIN_BELOW = 1 << 20  # a batched answer this small goes out joined: one send beats a copy of so few bytes


def _io_class(params: dict[str, str]) -> IOClass:
    try:
        return IOClass(params.get(IO_CLASS_PARAM, IOClass.USER))
    except ValueError:
        raise BadRequest(f"io_class must be one of {[c.value for c in IOClass]}") from None


def _method(request: Request, route: Route) -> None:
    """BadRequest unless `request` comes with `route`'s method (a lean route is matched by its path alone)."""
    if request.method != route.method:
        raise BadRequest(f"use {route.method} for {route.path}")


def _batch_param(params: dict[str, str], name: str, count: int | None = None) -> list[int]:
    """A batch's query parameter: one integer >= 0 per shard (`count` of them when given)."""
    raw = params.get(name)
    if raw is None:
        raise BadRequest(f"missing query parameter {name!r}")
    pieces = raw.split(BATCH_SEPARATOR)
    if not all(piece.isdigit() for piece in pieces):
        raise BadRequest(f"query parameter {name!r} must list integers >= 0 separated by {BATCH_SEPARATOR!r}")
    if count is not None and len(pieces) != count:
        raise BadRequest(f"query parameter {name!r} lists {len(pieces)} values for {count} shards")
    return [int(piece) for piece in pieces]


def _batch(request: Request, route: Route, names: tuple[str, ...]) -> list[list[int]]:
    """A batch's disk ids, vuids, bids and then the lists `names`, one value per shard in each."""
    _method(request, route)
    params = request.params
    if IO_CLASS_PARAM in params:
        raise BadRequest(f"{route.path} carries user shards only; background ones go one by one (each holds its "
                         "disk's background slot)")
    bids = _batch_param(params, "bid")
    if not 1 <= len(bids) <= MAX_BATCH:
        raise BadRequest(f"a batch holds 1 to {MAX_BATCH} shards, not {len(bids)}")
    disk_ids, vuids, *others = (_batch_param(params, name, len(bids)) for name in ("disk_id", "vuid", *names))
    return [disk_ids, vuids, bids, *others]


def _failure(error: RpcError) -> ShardFailure:
    return ShardFailure.model_construct(status=error.status, code=error.code, error=error.message)


# model_construct: these fields are ours, already typed; validating them again was ~3% of a loaded node's CPU
def _put_outcome(stored: ShardMeta | RpcError) -> ShardPutOutcome:
    if isinstance(stored, RpcError):
        return ShardPutOutcome.model_construct(stored=None, failure=_failure(stored))
    result = ShardPutResult.model_construct(bid=stored.bid, size=stored.size, crc=stored.crc)
    return ShardPutOutcome.model_construct(stored=result, failure=None)


def _read_outcome(read: memoryview | RpcError) -> ShardReadOutcome:
    if isinstance(read, RpcError):
        return ShardReadOutcome.model_construct(length=0, failure=_failure(read))
    return ShardReadOutcome.model_construct(length=len(read), failure=None)


class ShardRoutes:
    """The shard data path: put and get, one shard or a batch, served as lean routes (not through FastAPI)."""

    def __init__(self, node: Blobnode, reader: ReaderProcess | None) -> None:
        self.node = node
        self.reader = reader

    def lean_routes(self) -> dict[str, LeanHandler]:
        return {api.SHARD_PUT.path: self.put, api.SHARD_PUT_BATCH.path: self.put_batch,
                api.SHARD_GET.path: self.get, api.SHARD_GET_BATCH.path: self.get_batch}

    async def put(self, request: Request, respond: Responder) -> None:
        _method(request, api.SHARD_PUT)
        node, params = self.node, request.params
        size = int_param(params, "size")
        if size > node.config.max_shard_size:
            raise TooLarge(f"shard of {size} bytes exceeds the limit of {node.config.max_shard_size}")
        disk_id, vuid, bid = int_param(params, "disk_id"), int_param(params, "vuid"), int_param(params, "bid")
        io_class = _io_class(params)
        node.disk(disk_id)  # refuse before reading the body
        expected_crc = int_param(params, CRC_PARAM) if CRC_PARAM in params else None
        data = await request.body(size)
        async with node.background(disk_id, io_class):
            meta = await node.put_shard(disk_id, vuid, bid, data, io_class, expected_crc)
        await respond.json(ShardPutResult.model_construct(bid=bid, size=meta.size, crc=meta.crc))

    async def get(self, request: Request, respond: Responder) -> None:
        _method(request, api.SHARD_GET)
        params = request.params
        size = int_param(params, "size") if "size" in params else None
        disk_id, io_class = int_param(params, "disk_id"), _io_class(params)
        if io_class is IOClass.BACKGROUND and self.reader is not None:
            self.reader.wanted()  # the next ones go to the reader, once the caller sees it in /stat
        async with self.node.background(disk_id, io_class):
            meta, length, pieces = await self.node.open_shard_read(
                disk_id, int_param(params, "vuid"), int_param(params, "bid"), int_param(params, "offset", 0), size,
                io_class)
            await respond.stream(length, pieces, {"x-shard-crc": str(meta.crc), "x-shard-size": str(meta.size)})

    async def put_batch(self, request: Request, respond: Responder) -> None:
        disk_ids, vuids, bids, sizes, crcs = _batch(request, api.SHARD_PUT_BATCH, ("size", CRC_PARAM))
        if max(sizes) > self.node.config.max_shard_size:
            raise TooLarge(f"shard of {max(sizes)} bytes exceeds the limit of {self.node.config.max_shard_size}")
        data = await request.body(sum(sizes))
        writes, offset = [], 0
        for disk_id, vuid, bid, size, crc in zip(disk_ids, vuids, bids, sizes, crcs, strict=True):
            writes.append(ShardWrite(disk_id, vuid, bid, data[offset:offset + size], crc))
            offset += size
        outcomes = await self.node.put_shards(writes)
        await respond.json(ShardPutBatchResult(shards=[_put_outcome(o) for o in outcomes]))

    async def get_batch(self, request: Request, respond: Responder) -> None:
        disk_ids, vuids, bids, offsets, sizes = _batch(request, api.SHARD_GET_BATCH, ("offset", "size"))
        if sum(sizes) > MAX_BATCH_BYTES:
            raise BadRequest(f"a batched read asks for {sum(sizes)} bytes, at most {MAX_BATCH_BYTES}")
        reads = [ShardRead(*read) for read in zip(disk_ids, vuids, bids, offsets, sizes, strict=True)]
        outcomes = await self.node.read_shards(reads)
        head = ShardGetBatchHead.model_construct(shards=[_read_outcome(o) for o in outcomes])
        pieces = [head.model_dump_json().encode() + b"\n",
                  *(outcome for outcome in outcomes if not isinstance(outcome, RpcError))]
        length = sum(len(piece) for piece in pieces)
        if length < JOIN_BELOW:
            pieces = [b"".join(pieces)]
        await respond.stream(length, ready(*pieces), {})


def _serve_node(app: FastAPI, node: Blobnode, scrubber: Scrubber | None, reader: ReaderProcess | None) -> None:
    def with_scrub(stat: DiskStat) -> DiskStat:
        return stat if scrubber is None else stat.model_copy(update={"scrub": scrubber.stat(stat.disk_id)})

    @serves(app, api.STAT)
    async def stat() -> NodeStat:
        found = await node.stat()
        return found.model_copy(update={"disks": [with_scrub(d) for d in found.disks],
                                        "background_host": reader.url if reader is not None else ""})

    @serves(app, api.DISK_STAT)
    async def disk_stat(disk_id: int = Query(ge=0)) -> DiskStat:
        return with_scrub(await node.disk_stat(disk_id))

    @serves(app, api.INSPECT_EXPORT)
    async def inspect_export(req: ExportRequest) -> ExportResult:
        return ExportResult(exports=await node.export(req))


def _public_keys(node: Blobnode, kind: Kind) -> list[str] | None:
    """The keys checking `kind` tickets: without auth (None) every route is open, and so are these; with auth, the
    ticket of the service deciding the call is needed (libs/rpc/tickets.py)."""
    auth = node.config.auth
    return None if auth is None else auth.ticket_public_keys.get(kind, [])


def _gate(node: Blobnode, kind: Kind) -> Gate:
    return Gate(_public_keys(node, key_kind(kind)), node.config.advertised_host, kind)


def _serve_chunks(app: FastAPI, node: Blobnode) -> None:
    epochs = Gate(_public_keys(node, key_kind(Kind.EPOCH)), cluster_host(node.config.cluster_id), Kind.EPOCH)

    def check_epoch(req: ChunkChange | TaskFenceChange) -> None:
        """A scheduler's change goes only under an epoch clustermgr's ticket shows to be a lease's."""
        if req.scheduler_epoch is not None:
            epochs.check(req.epoch_ticket, 0, 0, req.scheduler_epoch)

    @serves(app, api.CHUNK_CREATE)
    async def chunk_create(req: ChunkCreate) -> ChunkInfo:
        check_epoch(req)
        return await node.create_chunk(req.disk_id, req.vuid, req.chunk_size, req.scheduler_epoch)

    def chunk_status_route(route: Route, status: ChunkStatus) -> None:
        async def set_status(req: ChunkChange) -> ChunkInfo:
            check_epoch(req)
            return await node.set_chunk_status(req.disk_id, req.vuid, status, req.scheduler_epoch)

        serves(app, route)(set_status)

    releases = _gate(node, Kind.RELEASE)

    @serves(app, api.CHUNK_RELEASE)
    async def chunk_release(req: ChunkRelease) -> ChunkInfo:
        releases.check(req.ticket, req.disk_id, req.vuid)
        check_epoch(req)
        return await node.set_chunk_status(req.disk_id, req.vuid, ChunkStatus.RELEASED, req.scheduler_epoch)

    chunk_status_route(api.CHUNK_READONLY, ChunkStatus.READONLY)
    chunk_status_route(api.CHUNK_READWRITE, ChunkStatus.NORMAL)

    @serves(app, api.CHUNK_TASK_FENCE)
    async def chunk_task_fence(req: TaskFenceChange) -> ChunkInfo:
        check_epoch(req)
        return await node.set_task_fence(req.disk_id, req.vuid, req.scheduler_epoch, req.token)

    @serves(app, api.CHUNK_COMPACT)
    async def chunk_compact(req: ChunkRef) -> ChunkInfo:
        return await node.compact_chunk(req.disk_id, req.vuid)

    @serves(app, api.CHUNK_LIST)
    async def chunk_list(disk_id: int = Query(ge=0)) -> ChunkList:
        return ChunkList(chunks=await node.list_chunks(disk_id))

    @serves(app, api.CHUNK_STAT)
    async def chunk_stat(disk_id: int = Query(ge=0), vuid: int = Query(ge=0)) -> ChunkStat:
        return await node.chunk_stat(disk_id, vuid)


def _serve_shard_records(app: FastAPI, node: Blobnode) -> None:
    """The shard routes besides the data path: marking, removing, stat and listing."""

    async def set_status(req: ShardRef, status: ShardStatus | None, io_class: IOClass) -> ShardStatusResult:
        async with node.background(req.disk_id, io_class):
            meta = await node.set_shard_status(req.disk_id, req.vuid, req.bid, status, io_class)
        return ShardStatusResult(bid=req.bid, status=meta.status.name.lower() if meta else "deleted")

    deletes, discards = _gate(node, Kind.DELETE), _gate(node, Kind.DISCARD)
    intents = IntentGate(_public_keys(node, Kind.INTENT), node.config.cluster_id)

    def delete_step(route: Route, status: ShardStatus | None) -> None:
        """The mark, then the delete for good (which the blobnode takes only `delete_hold` after the mark): each
        with tinker's delete ticket for the shard and access's intent for its blob."""
        async def step(req: ShardDelete, io_class: IOClass = IOClass.USER) -> ShardStatusResult:
            deletes.check(req.ticket, req.disk_id, req.vuid, req.bid)
            intents.check(req.intent, Vuid(req.vuid).vid(), req.bid)
            return await set_status(req, status, io_class)

        serves(app, route)(step)

    delete_step(api.SHARD_MARK_DELETE, ShardStatus.MARK_DELETED)
    delete_step(api.SHARD_DELETE, None)

    @serves(app, api.SHARD_UNMARK_DELETE)
    async def shard_unmark(req: ShardRef, io_class: IOClass = IOClass.USER) -> ShardStatusResult:
        """An undelete's: it destroys nothing, so it takes no ticket."""
        return await set_status(req, ShardStatus.NORMAL, io_class)

    @serves(app, api.SHARD_DISCARD)
    async def shard_discard(req: ShardDiscard, io_class: IOClass = IOClass.USER) -> ShardStatusResult:
        tasked = req.task_token is not None
        if tasked:
            discards.check(req.ticket, req.disk_id, req.vuid, req.task_token)
        async with node.background(req.disk_id, io_class):
            await node.discard_shard(req.disk_id, req.vuid, req.bid, io_class, req.task_token,
                                     corrupt_only=discards.enforced and not tasked)
        return ShardStatusResult(bid=req.bid, status="deleted")

    @serves(app, api.SHARD_STAT)
    async def shard_stat(disk_id: int = Query(ge=0), vuid: int = Query(ge=0), bid: int = Query(ge=0),
                         io_class: IOClass = IOClass.USER) -> ShardInfo:
        async with node.background(disk_id, io_class):
            return shard_info(await node.shard_stat(disk_id, vuid, bid, io_class))

    @serves(app, api.SHARD_LIST)
    async def shard_list(disk_id: int = Query(ge=0), vuid: int = Query(ge=0), start_bid: int = Query(0, ge=0),
                         count: int | None = Query(None, ge=1, le=100_000),
                         status: str | None = Query(None, pattern="^(normal|mark_deleted)$"),
                         io_class: IOClass = IOClass.USER) -> ShardList:
        wanted = ShardStatus[status.upper()] if status else None
        async with node.background(disk_id, io_class):
            shards = await node.list_shards(disk_id, vuid, start_bid, count, wanted, io_class)
        return ShardList(shards=[shard_info(m) for m in shards])


def build_app(node: Blobnode, link: ClusterLink | None = None, scrubber: Scrubber | None = None,
              reader: ReaderProcess | None = None, upkeep: Upkeep | None = None) -> WithLeanRoutes:
    lives = [x.life for x in (scrubber, link, upkeep) if x is not None]

    async def start() -> None:
        for life in lives:
            await life.start()

    async def stop() -> None:
        for life in lives:
            await life.stop()
        if reader is not None:
            await reader.stop()
        await asyncio.to_thread(node.close)  # flush RocksDB and close chunk files

    app = create_app("blobnode", on_start=start, on_stop=stop)
    _serve_node(app, node, scrubber, reader)
    _serve_chunks(app, node)
    _serve_shard_records(app, node)
    return with_lean_routes(app, ShardRoutes(node, reader).lean_routes())
