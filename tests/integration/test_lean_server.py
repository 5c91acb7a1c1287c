"""The blobnode's lean shard protocol on a real process, over raw sockets: pipelined and kept-alive requests,
connections handed over to uvicorn (another route, a chunked body, HTTP/1.0) that still serve shards, and the
refusals it makes itself (unsigned, too large, a stalled or abandoned body), each leaving the node serving."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
from isal.isal_zlib import crc32

from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.routes import CATALOG
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import AUTH_HEADER
from blobstore_server.services.blobnode.client import BlobnodeClient
from tests.support.processes import SIGNED, BlobnodeFactory, Service

VUID = Vuid.make(9, 1, 1)


class Wire:
    """One raw connection: requests written as given, answers read one by one (status, headers, body)."""

    def __init__(self, url: str) -> None:
        self.hostport = url.removeprefix("http://")
        host, port = self.hostport.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.pending = b""

    def request(self, method: str, target: str, body: bytes = b"", *, signed: bool = True, extra: str = "",
                length: bool = True) -> bytes:
        signer = auth.installed()
        assert signer is not None
        lines = [f"{method} {target} HTTP/1.1", f"host: {self.hostport}"]
        if signed:
            header = signer.header(method, f"http://{self.hostport}{target}", None, body, CATALOG)
            lines.append(f"{AUTH_HEADER}: {header}")
        if length and (body or method == "PUT"):
            lines.append(f"content-length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode() + body

    def send(self, *requests: bytes) -> None:
        self.sock.sendall(b"".join(requests))

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.pending:
            self._more()
        head, _, self.pending = self.pending.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.pending) < length:
            self._more()
        body, self.pending = self.pending[:length], self.pending[length:]
        return int(lines[0].split()[1]), headers, body

    def closed(self) -> bool:
        """Whether the server closed the connection (after everything it sent was read)."""
        self.sock.settimeout(5)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _more(self) -> None:
        piece = self.sock.recv(1 << 16)
        if not piece:
            raise ConnectionError("the server closed the connection")
        self.pending += piece

    def close(self) -> None:
        self.sock.close()


def put_target(bid: int, data: bytes, size: int | None = None) -> str:
    size = len(data) if size is None else size
    return f"/shard/put?disk_id=1&vuid={int(VUID)}&bid={bid}&size={size}&crc={crc32(data)}"


def get_target(bid: int) -> str:
    return f"/shard/get?disk_id=1&vuid={int(VUID)}&bid={bid}"


def node_with_chunk(blobnode_factory: BlobnodeFactory, **config: object) -> Service:
    node = blobnode_factory(**config)

    async def create() -> None:
        async with BlobnodeClient() as client:
            await client.create_chunk(node.url, 1, VUID)

    asyncio.run(create())
    return node


def test_pipelined_requests_and_a_connection_handed_over_to_uvicorn(blobnode_factory: BlobnodeFactory) -> None:
    node = node_with_chunk(blobnode_factory)
    one, two = b"first shard" * 100, bytes(range(256)) * 300  # the second larger than one read
    wire = Wire(node.url)
    try:
        wire.send(wire.request("PUT", put_target(1, one), one), wire.request("PUT", put_target(2, two), two),
                  wire.request("GET", get_target(1)), wire.request("GET", get_target(2)))
        put1, put2, get1, get2 = (wire.answer() for _ in range(4))
        assert put1[0] == put2[0] == 200 and get1[0] == get2[0] == 200
        assert get1[2] == one and get2[2] == two and get2[1]["x-shard-crc"] == str(crc32(two))
        assert "connection" not in get2[1]  # kept alive
        # a control route on the same connection: uvicorn takes it over, and still serves shards on it
        wire.send(wire.request("GET", "/stat"))
        status, _, body = wire.answer()
        assert status == 200 and b"disks" in body
        wire.send(wire.request("GET", get_target(2)))
        assert wire.answer()[2] == two
    finally:
        wire.close()

    chunked = Wire(node.url)  # a chunked body is uvicorn's to parse; the shard route still takes it
    try:
        data = b"sent in chunks"
        body = f"{len(data[:5]):x}\r\n".encode() + data[:5] + f"\r\n{len(data[5:]):x}\r\n".encode() + data[5:] + \
            b"\r\n0\r\n\r\n"
        signer = auth.installed()
        assert signer is not None
        # no declared length to sign: the signature covers length 0 and the CRC in the query, as for any chunked body
        header = signer.header("PUT", f"http://{chunked.hostport}{put_target(3, data)}", None, b"", CATALOG)
        chunked.send(f"PUT {put_target(3, data)} HTTP/1.1\r\nhost: {chunked.hostport}\r\n{AUTH_HEADER}: {header}\r\n"
                     "transfer-encoding: chunked\r\n\r\n".encode() + body)
        assert chunked.answer()[0] == 200
    finally:
        chunked.close()
    old = Wire(node.url)  # HTTP/1.0 too
    try:
        old.send(old.request("GET", get_target(3)).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        assert old.answer()[2] == data
    finally:
        old.close()
    counts = httpx.get(f"{node.url}/metrics?name[]=blobstore_http_requests_total", auth=SIGNED).text
    assert 'route="/shard/put"' in counts and 'route="/shard/get"' in counts


def test_refusals_leave_the_node_serving(blobnode_factory: BlobnodeFactory) -> None:
    node = node_with_chunk(blobnode_factory, limits={"body_timeout": 1.0}, max_shard_size=4096)
    data = b"x" * 1000
    wire = Wire(node.url)
    try:
        wire.send(wire.request("PUT", put_target(1, data), data, signed=False))
        status, _, body = wire.answer()
        assert status == 401 and b"needs a signed request" in body
        wire.send(wire.request("GET", get_target(1)).replace(node.url.removeprefix("http://").encode(),
                                                             b"elsewhere:1", 1))
        status, _, body = wire.answer()
        assert status == 401 and b"signed for" in body
        wire.send(wire.request("GET", get_target(1)))  # an unread body that was all there did not end the connection
        assert wire.answer()[0] == 404
    finally:
        wire.close()

    too_large = Wire(node.url)  # refused before its body is read: the connection then closes
    try:
        big = bytes(10_000)
        too_large.send(too_large.request("PUT", put_target(2, big), big)[:-len(big)])  # the head alone
        status, headers, body = too_large.answer()
        assert status == 413 and headers.get("connection") == "close" and too_large.closed()
    finally:
        too_large.close()

    stalled = Wire(node.url)
    try:
        stalled.send(stalled.request("PUT", put_target(3, data), data)[:-600])  # 400 bytes of 1000, then nothing
        started = time.monotonic()
        status, _, body = stalled.answer()
        assert status == 408 and b"no body received" in body and time.monotonic() - started < 5
    finally:
        stalled.close()

    gone = Wire(node.url)  # a client that goes away mid-body stores nothing
    gone.send(gone.request("PUT", put_target(4, data), data)[:-500])
    gone.close()
    time.sleep(0.3)
    check = Wire(node.url)
    try:
        check.send(check.request("GET", get_target(3)), check.request("GET", get_target(4)),
                   check.request("PUT", put_target(5, data), data), check.request("GET", get_target(5)))
        assert [check.answer()[0] for _ in range(3)] == [404, 404, 200]
        assert check.answer()[2] == data
    finally:
        check.close()
