"""The background reader: a process of the blobnode's that serves its background shard reads (repair, migration,
inspection), forked, started and stopped by the blobnode (services/blobnode/reader_process.py); `main` reads the
blobnode's own flags (`-c blobnode.json`).

Why a process: the bytes of a rebuild are mostly reads (N of every N+1 bytes it moves), and in the blobnode
they went through the event loop that serves users. This process runs at SCHED_IDLE: the kernel gives it only
CPU nobody else wants, so users are served first where the CPU is short, and a rebuild takes all of it where it
is not. Thread priorities cannot do that inside one process: a thread descheduled while it holds the GIL would
stall the loop serving users. It reads with the disks' background caps (concurrency and MB/s, services/
blobnode/iolimit.py) but without yielding to user latency: the scheduler class does that.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

from blobstore_server.libs.chunkfile import ChunkError
from blobstore_server.libs.proto import blobnode as api
from blobstore_server.libs.proto.blobnode import IO_CLASS_PARAM, IOClass
from blobstore_server.libs.rpc.errors import BadRequest, Unavailable
from blobstore_server.libs.rpc.lean_server import Request, Responder
from blobstore_server.libs.rpc.server import ASGIApp, create_app, int_param, run_service, with_lean_routes
from blobstore_server.services.blobnode.config import BlobnodeConfig
from blobstore_server.services.blobnode.iolimit import BURST_SECONDS, BackgroundGate
from blobstore_server.services.blobnode.node import READ_PIECE, MiB, chunk_rpc_error, stream_pieces
from blobstore_server.services.blobnode.reader import DiskReader

BIND_ENV = "BLOBNODE_READER_BIND"  # the address the blobnode chose for its reader
T = TypeVar("T")


def _typed(read: Callable[[], T]) -> T:
    """`read()`, its chunk errors as the typed RPC errors the blobnode answers with."""
    try:
        return read()
    except ChunkError as exc:
        raise chunk_rpc_error(exc) from exc


def build(config: BlobnodeConfig) -> tuple[ASGIApp, str]:
    readers = {reader.disk_id: reader for reader in (DiskReader(Path(d.path)) for d in config.disks)}
    executors = {disk_id: ThreadPoolExecutor(config.background_concurrency, thread_name_prefix=f"disk{disk_id}")
                 for disk_id in readers}
    ceiling = config.background_mb_per_sec * MiB
    gates = {disk_id: BackgroundGate(ceiling, config.background_concurrency, burst=ceiling * BURST_SECONDS)
             for disk_id in readers}

    async def stop() -> None:
        for executor in executors.values():
            executor.shutdown(wait=True)
        for reader in readers.values():
            await asyncio.to_thread(reader.close)

    app = create_app("blobnode-reader", on_stop=stop)

    async def shard_get(request: Request, respond: Responder) -> None:
        if request.method != api.SHARD_GET.method:
            raise BadRequest(f"use {api.SHARD_GET.method} for {api.SHARD_GET.path}")
        params = request.params
        if params.get(IO_CLASS_PARAM) != IOClass.BACKGROUND:
            raise BadRequest(f"the background reader serves io_class={IOClass.BACKGROUND} only: ask the blobnode")
        disk_id = int_param(params, "disk_id")
        reader = readers.get(disk_id)
        if reader is None:
            raise Unavailable(f"the background reader does not hold disk {disk_id}: ask the blobnode")
        size = int_param(params, "size") if "size" in params else None
        vuid, bid, offset = int_param(params, "vuid"), int_param(params, "bid"), int_param(params, "offset", 0)
        executor, gate = executors[disk_id], gates[disk_id]
        loop = asyncio.get_running_loop()

        async with gate.slot():
            meta, pieces, first = await loop.run_in_executor(
                executor, partial(_typed, partial(reader.open_read, vuid, bid, offset, size, READ_PIECE)))
            length = meta.size - offset if size is None else size
            gate.charge(length)
            rest = stream_pieces(executor, first, length, partial(_typed, partial(next, pieces, None)))
            await respond.stream(length, rest, {"x-shard-crc": str(meta.crc), "x-shard-size": str(meta.size)})

    return with_lean_routes(app, {api.SHARD_GET.path: shard_get}), os.environ[BIND_ENV]


def main() -> None:
    run_service("blobnode-reader", BlobnodeConfig, build, routes=api.ROUTES)
