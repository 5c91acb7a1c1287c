"""Async client of kvserver: finds the leader, multiplexes requests on one connection per
server, retries on NotLeader and on a dead server until its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Any

from blobstore_server.libs.raft.transport import FrameWriter, read_frame, split_addr
from tests.support.raftkv.kvproto import REQ_HEAD, RESP_HEAD, Op, Status, encode_put


class KVError(Exception):
    """The cluster answered with an error, or no answer came before the deadline."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.out = FrameWriter(writer)
        self.waiting: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                body = await read_frame(reader)
                rid, status = RESP_HEAD.unpack_from(body)
                fut = self.waiting.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result((status, body[RESP_HEAD.size:]))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("connection lost"))
            self.waiting.clear()
            self.writer.close()

    @property
    def alive(self) -> bool:
        return not self.task.done()

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


class KVClient:
    def __init__(self, addrs: dict[int, str], timeout: float = 10.0, attempt_timeout: float = 1.0) -> None:
        self.addrs = dict(addrs)
        self.timeout, self.attempt_timeout = timeout, attempt_timeout
        self.leader: int | None = None
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count(1)

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()
        for conn in conns:
            with contextlib.suppress(asyncio.CancelledError):
                await conn.task

    async def _conn(self, node: int) -> _Conn:
        conn = self._conns.get(node)
        if conn is None or not conn.alive:
            host, port = split_addr(self.addrs[node])
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.attempt_timeout)
            conn = self._conns[node] = _Conn(reader, writer)
        return conn

    async def call_node(self, node: int, op: Op, payload: bytes = b"") -> tuple[int, bytes]:
        """One attempt at one server: (status, payload)."""
        conn = await self._conn(node)
        rid = next(self._ids)
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        conn.waiting[rid] = fut
        if not conn.out.send(REQ_HEAD.pack(rid, op) + payload):
            raise ConnectionError("connection closing or congested")
        try:
            return await asyncio.wait_for(fut, self.attempt_timeout)
        finally:
            conn.waiting.pop(rid, None)

    async def call(self, op: Op, payload: bytes = b"") -> bytes:
        """Send to the leader, following hints and skipping dead servers, until the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        order = itertools.cycle(sorted(self.addrs))
        last = "no attempt"
        while loop.time() < deadline:
            node = self.leader if self.leader in self.addrs else next(order)
            try:
                status, body = await self.call_node(node, op, payload)
            except (OSError, ConnectionError, TimeoutError) as e:
                self.leader, last = None, f"node {node}: {e!r}"
                await asyncio.sleep(0.01)
                continue
            if status == Status.OK:
                self.leader = node
                return body
            if status == Status.NOT_LEADER:
                hint = int(body) if body else None
                self.leader = hint if hint != node else None
                last = f"node {node} is not leader"
                if hint is None:
                    await asyncio.sleep(0.02)
                continue
            if status == Status.TIMEOUT:
                self.leader, last = None, f"node {node}: timed out"
                continue
            raise KVError(body.decode())
        raise KVError(f"no answer before the deadline ({last})")

    async def put(self, key: bytes, value: bytes) -> None:
        await self.call(Op.PUT, encode_put(Op.PUT, key, value))

    async def delete(self, key: bytes) -> None:
        await self.call(Op.DELETE, encode_put(Op.DELETE, key))

    async def get(self, key: bytes) -> bytes | None:
        body = await self.call(Op.GET, key)
        return body[1:] if body else None

    async def add_learner(self, node_id: int, addr: str) -> None:
        await self.call(Op.ADD_LEARNER, json.dumps({"id": node_id, "addr": addr}).encode())

    async def promote(self, node_id: int) -> None:
        await self.call(Op.PROMOTE, json.dumps({"id": node_id}).encode())

    async def remove(self, node_id: int) -> None:
        await self.call(Op.REMOVE, json.dumps({"id": node_id}).encode())

    async def status(self, node: int) -> dict[str, Any]:
        return json.loads((await self.call_node(node, Op.STATUS))[1])

    async def checksum(self, node: int) -> dict[str, int]:
        return json.loads((await self.call_node(node, Op.CHECKSUM))[1])

    async def try_status(self, node: int) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ConnectionError, TimeoutError, ValueError):
            return await self.status(node)
        return None
