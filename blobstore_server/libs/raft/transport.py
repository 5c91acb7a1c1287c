"""Persistent TCP connections between peers carrying length-prefixed frames.

Each node dials one connection per peer it knows of and sends on it. Frames flow both ways on
every connection, so a node that does not know a peer's address yet (a joining learner) answers
on the connection that peer dialed in on. Sending never blocks: a message to an unreachable or
congested peer is dropped, which Raft tolerates (the leader retries on the next heartbeat).

With a `key`, both ends prove they hold it before a frame moves: the accepting node sends a random challenge;
the dialer answers with its HMAC under the key plus a challenge of its own, which the acceptor answers in turn
(each answer labelled by its side, so neither can be reflected back). The acceptor reads no frame from a dialer
that failed, and a dialer sends none to an acceptor that failed: only members speak Raft, and a member never
talks to an impostor listening on a peer's address.

With `tls`, every connection is TLS first: the acceptor presents its host's certificate, the dialer checks it
against the cluster CA for the address it dialed, and only then does the member proof (and every frame) move,
encrypted. The proof stays: a certificate says which host this is, the key that it is a clustermgr replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import ssl
import struct
from collections.abc import Awaitable, Callable

from blobstore_server.libs.raft.codec import decode, encode
from blobstore_server.libs.raft.config import RaftTLS
from blobstore_server.libs.raft.messages import Message

log = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
MAX_FRAME = 64 << 20
MAX_BUFFERED = 32 << 20  # per peer: beyond this, drop instead of queueing without bound


CHALLENGE = 16


def _answer(key: bytes, side: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, b"raft member " + side + b" " + challenge, hashlib.sha256).digest()


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _LEN.unpack(await reader.readexactly(4))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return await reader.readexactly(size)


def contexts(tls: RaftTLS) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The acceptor's context (this node's certificate) and the dialer's (peers checked against the CA)."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tls.cert_file, tls.key_file)
    return server, ssl.create_default_context(cafile=tls.ca_file)


class FrameWriter:
    """Coalesces the frames queued during one event-loop iteration into one socket write: a
    syscall per frame costs more than the rest of handling a small request."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._frames: list[bytes] = []

    def send(self, body: bytes) -> bool:
        w = self.writer
        if w.is_closing() or w.transport.get_write_buffer_size() > MAX_BUFFERED:
            return False
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames += (_LEN.pack(len(body)), body)
        return True

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if not self.writer.is_closing():
            self.writer.write(b"".join(frames))


class _Peer:
    """The outbound connection to one peer, re-dialed in the background while it is down."""

    def __init__(self, addr: str, on_frame: Callable[[bytes, FrameWriter], Awaitable[None]],
                 key: bytes | None, dialing: ssl.SSLContext | None) -> None:
        self.addr = addr
        self.on_frame = on_frame
        self.key = key
        self.dialing = dialing
        self.untrusted = False  # its certificate was refused: said once, not at every re-dial
        self.writer: FrameWriter | None = None
        self.task: asyncio.Task[None] | None = None

    async def keep_connected(self) -> None:
        backoff = 0.02
        while True:
            try:
                host, port = split_addr(self.addr)
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=self.dialing), 1.0)
                if self.key is not None:
                    await asyncio.wait_for(self._prove(self.key, reader, writer), 1.0)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:  # ssl.SSLError is an OSError
                if isinstance(exc, ssl.SSLCertVerificationError) and not self.untrusted:
                    self.untrusted = True
                    log.warning("refused to talk Raft to %s: %s", self.addr, exc.verify_message)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.2)
                continue
            backoff = 0.02
            self.untrusted = False
            self.writer = FrameWriter(writer)
            with contextlib.suppress(OSError, ConnectionError, asyncio.IncompleteReadError):
                while True:
                    await self.on_frame(await read_frame(reader), self.writer)
            self.writer = None
            writer.close()

    async def _prove(self, key: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer the acceptor's challenge and check its answer to ours; ConnectionError if it has no key."""
        challenge = await reader.readexactly(CHALLENGE)
        mine = os.urandom(CHALLENGE)
        writer.write(_answer(key, b"dialer", challenge) + mine)
        if not hmac.compare_digest(await reader.readexactly(32), _answer(key, b"acceptor", mine)):
            writer.close()
            log.warning("refused to talk Raft to %s: it could not prove it is a member", self.addr)
            raise ConnectionError(f"{self.addr} is not a member")

    def send(self, body: bytes) -> bool:
        return self.writer is not None and self.writer.send(body)

    def close(self) -> None:
        if self.task:
            self.task.cancel()
        if self.writer:
            self.writer.writer.close()


class Transport:
    def __init__(self, node_id: int, listen: str, on_message: Callable[[Message], Awaitable[None] | None],
                 key: bytes | None = None, tls: RaftTLS | None = None) -> None:
        self.key = key
        self._accepting: ssl.SSLContext | None = None
        self._dialing: ssl.SSLContext | None = None
        if tls is not None:
            self._accepting, self._dialing = contexts(tls)
        self.node_id = node_id
        self.listen = listen
        self.on_message = on_message
        self.peers: dict[int, _Peer] = {}
        self._server: asyncio.Server | None = None
        self._inbound: set[asyncio.Task[None]] = set()
        self._reply: dict[int, FrameWriter] = {}  # peers reachable on a connection they dialed

    async def start(self) -> None:
        host, port = split_addr(self.listen)
        self._server = await asyncio.start_server(self._serve, host, port, ssl=self._accepting)

    def set_peers(self, addrs: dict[int, str]) -> None:
        """Dial new peers, hang up on removed ones."""
        for pid in [p for p in self.peers if p not in addrs or self.peers[p].addr != addrs[p]]:
            self.peers.pop(pid).close()
        for pid, addr in addrs.items():
            if pid != self.node_id and pid not in self.peers:
                peer = self.peers[pid] = _Peer(addr, self._on_frame, self.key, self._dialing)
                peer.task = asyncio.get_running_loop().create_task(peer.keep_connected())

    def send(self, msg: Message) -> bool:
        body = encode(msg)
        peer = self.peers.get(msg.to)
        if peer is not None and peer.send(body):
            return True
        w = self._reply.get(msg.to)
        return w is not None and w.send(body)

    async def _on_frame(self, body: bytes, writer: FrameWriter) -> None:
        msg = decode(body)
        if msg.frm not in self.peers:
            self._reply[msg.frm] = writer
        result = self.on_message(msg)
        if result is not None:
            await result

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._inbound.add(task)
        fw = FrameWriter(writer)
        try:
            if self.key is not None and not await self._admitted(reader, writer):
                return
            while True:
                await self._on_frame(await read_frame(reader), fw)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._inbound.discard(task)
            writer.close()

    async def _admitted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        assert self.key is not None
        challenge = os.urandom(CHALLENGE)
        writer.write(challenge)
        try:
            answer = await asyncio.wait_for(reader.readexactly(32 + CHALLENGE), 2.0)
        except TimeoutError:
            answer = b""
        if hmac.compare_digest(answer[:32], _answer(self.key, b"dialer", challenge)):
            writer.write(_answer(self.key, b"acceptor", answer[32:]))
            return True
        log.warning("refused a Raft connection from %s: not a member", writer.get_extra_info("peername"))
        return False

    async def close(self) -> None:
        for peer in self.peers.values():
            peer.close()
        self.peers.clear()
        if self._server:
            self._server.close()
        for task in list(self._inbound):
            task.cancel()
