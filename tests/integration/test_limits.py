"""Per-request limits on a real service: too many requests from one address, oversized headers, and a
client that stalls while sending its body."""

from __future__ import annotations

import socket
import time

import httpx

from blobstore_server.libs.rpc.limits import ClientRates
from tests.support.processes import SIGNED, BlobnodeFactory


def _read_answer(sock: socket.socket) -> str:
    """The whole answer: the server may send its headers and its body in separate packets."""
    received = b""
    while b"\r\n\r\n" not in received or len(received.partition(b"\r\n\r\n")[2]) < _length(received):
        piece = sock.recv(4096)
        if not piece:
            break
        received += piece
    return received.decode()


def _length(received: bytes) -> int:
    for line in received.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_client_rates_admit_a_burst_then_the_rate() -> None:
    now = [0.0]
    rates = ClientRates(rate=2.0, burst=3, clock=lambda: now[0])
    assert [rates.admit("a") for _ in range(4)] == [True, True, True, False]
    assert rates.admit("b")  # another address has its own budget
    now[0] = 0.5
    assert rates.admit("a") and not rates.admit("a")


def test_rate_header_and_slow_body_limits(blobnode_factory: BlobnodeFactory) -> None:
    limits = {"client_rate": 5, "client_burst": 5, "max_header_bytes": 2048, "body_timeout": 1.0}
    node = blobnode_factory("limited", disks=1, limits=limits)
    with httpx.Client(base_url=node.url, timeout=10, auth=SIGNED) as client:
        time.sleep(1.1)  # the start-up health checks used some of the budget
        codes = [client.get("/stat").status_code for _ in range(12)]
        assert codes[:5] == [200] * 5 and 429 in codes[5:]
        refused = next(r for r in (client.get("/stat") for _ in range(3)) if r.status_code == 429)
        assert refused.json()["code"] == "too_many_requests"
        time.sleep(1.2)
        big = client.get("/stat", headers={"x-padding": "p" * 4000})
        assert big.status_code == 431 and "headers" in big.json()["error"]
    time.sleep(1.2)
    host, port = node.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /chunk/create HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"disk_id\"")  # then nothing more
        answer = _read_answer(sock)
    assert answer.startswith("HTTP/1.1 408") and "request_timeout" in answer
    assert httpx.get(f"{node.url}/health").status_code == 200
