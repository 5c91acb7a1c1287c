"""A small replicated key-value store on the Raft library: the test fixture, the benchmark
target and the pattern clustermgr copies.

    python -m tests.support.raftkv.kvserver -c conf.json

`conf.json` holds `{"raft": {...RaftConfig...}, "client": "host:port"}`. Clients speak the
framing of `transport.py`: request `id u64, op u8, payload`; response `id u64, status u8,
payload` (see `kvproto.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import struct
from pathlib import Path

from pydantic import BaseModel

from blobstore_server.libs.kv import KVStore
from blobstore_server.libs.raft.config import RaftConfig
from blobstore_server.libs.raft.errors import LeadershipLost, NotLeader, ProposalDropped, RaftError
from blobstore_server.libs.raft.server import RaftServer
from blobstore_server.libs.raft.transport import FrameWriter, read_frame, split_addr
from tests.support.raftkv.kvproto import REQ_HEAD, RESP_HEAD, Op, Status, decode_put

log = logging.getLogger("raftkv")
DATA = "data"
_MASK = (1 << 64) - 1


def _digest(key: bytes, value: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(struct.pack("!I", len(key)) + key + value, digest_size=8).digest())


class KVStateMachine:
    """Keys and values in RocksDB (unsynced: the Raft log is the durable copy). The checksum
    is a sum of per-pair digests, kept up to date on every write, so it costs O(1) to read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kv = KVStore(path, [DATA], sync=False)
        self._ck = 0

    def apply(self, index: int, command: bytes) -> bytes:
        op, key, value = decode_put(command)
        old = self.kv.get(DATA, key)
        if old is not None:
            self._ck = (self._ck - _digest(key, old)) & _MASK
        if op == Op.PUT:
            self.kv.put(DATA, key, value)
            self._ck = (self._ck + _digest(key, value)) & _MASK
        else:
            self.kv.delete(DATA, key)
        return b""

    def get(self, key: bytes) -> bytes | None:
        return self.kv.get(DATA, key)

    def snapshot(self, dest_dir: Path) -> None:
        self.kv.checkpoint(dest_dir)

    def restore(self, src_dir: Path | None) -> None:
        self.kv.close()
        shutil.rmtree(self.path, ignore_errors=True)
        if src_dir is not None:
            shutil.copytree(src_dir, self.path)
        self.kv = KVStore(self.path, [DATA], sync=False)
        self._ck = 0
        for key, value in self.kv.items(DATA):
            self._ck = (self._ck + _digest(key, value)) & _MASK

    def checksum(self) -> int:
        return self._ck

    def close(self) -> None:
        self.kv.close()


class KVServerConfig(BaseModel):
    raft: RaftConfig
    client: str


class KVServer:
    def __init__(self, config: KVServerConfig) -> None:
        self.config = config
        self.sm = KVStateMachine(config.raft.data_dir / "sm")
        self.raft = RaftServer(config.raft, self.sm)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        await self.raft.start()
        host, port = split_addr(self.config.client)
        self._server = await asyncio.start_server(self._serve, host, port)

    async def stop(self) -> None:
        if self._server:
            self._server.close()
        await self.raft.stop()
        self.sm.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: set[asyncio.Task[None]] = set()
        out = FrameWriter(writer)
        try:
            while True:
                body = await read_frame(reader)
                task = asyncio.get_running_loop().create_task(self._handle(body, out))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, body: bytes, out: FrameWriter) -> None:
        rid, op = REQ_HEAD.unpack_from(body)
        payload = body[REQ_HEAD.size:]
        try:
            status, result = Status.OK, await self._dispatch(Op(op), payload)
        except NotLeader as e:
            status, result = Status.NOT_LEADER, b"" if e.leader_hint is None else str(e.leader_hint).encode()
        except ProposalDropped:  # never applied: as safe to retry as NotLeader
            hint = self.raft.node.leader
            status, result = Status.NOT_LEADER, b"" if hint is None else str(hint).encode()
        except (TimeoutError, LeadershipLost):  # the outcome is unknown
            status, result = Status.TIMEOUT, b""
        except (RaftError, ValueError) as e:
            status, result = Status.ERROR, str(e).encode()
        out.send(RESP_HEAD.pack(rid, status) + result)

    async def _dispatch(self, op: Op, payload: bytes) -> bytes:
        raft = self.raft
        if op in (Op.PUT, Op.DELETE):
            return await raft.propose(payload)
        if op == Op.GET:
            await raft.read_index()
            value = self.sm.get(payload)
            return b"" if value is None else b"\x01" + value
        if op == Op.STATUS:
            return json.dumps(raft.status()).encode()
        if op == Op.CHECKSUM:  # read together on the loop: the checksum is the state at `applied`
            return json.dumps({"applied": raft.applied, "checksum": self.sm.checksum()}).encode()
        args = json.loads(payload)
        if op == Op.ADD_LEARNER:
            await raft.add_learner(args["id"], args["addr"])
        elif op == Op.PROMOTE:
            await raft.promote(args["id"])
        elif op == Op.REMOVE:
            await raft.remove(args["id"])
        return b""


async def _main(config: KVServerConfig) -> int:
    server = KVServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    fatal = loop.create_task(server.raft.wait_fatal())
    stopped = loop.create_task(stop.wait())
    await asyncio.wait([fatal, stopped], return_when=asyncio.FIRST_COMPLETED)
    if fatal.done():
        log.critical("stopping on invariant violation: %s", fatal.result())
        os._exit(70)  # loudly, without flushing anything further
    fatal.cancel()
    await server.stop()
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description="replicated kv on libs.raft")
    parser.add_argument("-c", "--config", required=True, type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = KVServerConfig.model_validate_json(args.config.read_text())
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    raise SystemExit(asyncio.run(_main(config)))


if __name__ == "__main__":
    main()
