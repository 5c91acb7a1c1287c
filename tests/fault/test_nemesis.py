"""The nemesis (cluster/nemesis.py) on three real network namespaces: a two-way cut, a one-way cut, a cut of
one service of a host, a pulled cable, and heal_all undoing all of it (also a cut nobody healed). Listeners are
real processes inside the hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore_server.cluster import nemesis, netns
from blobstore_server.cluster.netns import Network
from blobstore_server.cluster.procs import poll

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None,
                                reason="network namespaces and nftables need root and nft (make setup)")
# TCP listeners (ports 7000 and 7001) that accept and close, and a UDP listener that appends each datagram to a file.
LISTEN = """
import socket, sys, threading
tcp = socket.create_server((sys.argv[1], 7000))
other = socket.create_server((sys.argv[1], 7001))
def serve_other():
    while True:
        other.accept()[0].close()
threading.Thread(target=serve_other, daemon=True).start()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind((sys.argv[1], 7000))
def heard():
    while True:
        data, _ = udp.recvfrom(100)
        with open(sys.argv[2], "ab") as f: f.write(data + b"\\n")
threading.Thread(target=heard, daemon=True).start()
while True: tcp.accept()[0].close()
"""
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()"
SEND = ("import socket, sys; "
        "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(sys.argv[2].encode(), (sys.argv[1], 7000))")


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Network]:
    network = netns.plan_network(3, netns.free_index())
    listeners: list[subprocess.Popen[bytes]] = []
    try:
        netns.create(network)
        for h in network.hosts:
            listeners.append(subprocess.Popen([*h.wrap, sys.executable, "-c", LISTEN, h.address,
                                               str(tmp_path / f"{h.name}.heard")]))
        assert poll(lambda: all(_reaches(network, "root", h.name) for h in network.hosts), 10.0)
        yield network
    finally:
        for p in listeners:
            p.kill()
            p.wait()
        netns.destroy(network.prefix)


def _reaches(net: Network, source: str, target: str, port: int = 7000) -> bool:
    wrap = () if source == "root" else net.host(source).wrap
    return subprocess.run([*wrap, sys.executable, "-c", CONNECT, net.host(target).address, str(port)],
                          capture_output=True).returncode == 0


def _send(net: Network, source: str, target: str, text: str) -> None:
    subprocess.run([*net.host(source).wrap, sys.executable, "-c", SEND, net.host(target).address, text], check=True)


def test_cuts_isolation_and_heal_all(net: Network, tmp_path: Path) -> None:
    nemesis.cut(net, "h1", ["h2"])
    assert not _reaches(net, "h1", "h2") and not _reaches(net, "h2", "h1")
    assert _reaches(net, "h1", "h3") and _reaches(net, "h3", "h2") and _reaches(net, "root", "h1")

    nemesis.cut_one_way(net, "h3", ["h1"])  # h3 stops hearing h1; h1 still hears h3
    _send(net, "h1", "h3", "from h1")
    _send(net, "h3", "h1", "from h3")
    assert poll(lambda: (tmp_path / "h1.heard").exists() and b"from h3" in (tmp_path / "h1.heard").read_bytes(), 5.0)
    assert not (tmp_path / "h3.heard").exists()

    nemesis.cut_services(net, "h3", [("h2", 7001)])  # h3 loses h2's second service only
    assert not _reaches(net, "h3", "h2", 7001) and _reaches(net, "h3", "h2", 7000)
    assert _reaches(net, "h2", "h3", 7001) and _reaches(net, "root", "h2", 7001)

    nemesis.isolate(net, "h2")
    assert not _reaches(net, "root", "h2") and not _reaches(net, "h3", "h2")

    nemesis.cut(net, "h3", ["root"])  # left uncured on purpose: heal_all finds it by name
    assert not _reaches(net, "root", "h3")
    nemesis.heal_all(net)
    nemesis.heal_all(net)  # idempotent
    for source in ("root", "h1", "h2", "h3"):
        for target in ("h1", "h2", "h3"):
            if source != target:
                assert poll(lambda s=source, t=target: _reaches(net, s, t), 5.0), (source, target)  # type: ignore[misc]
    tables = [subprocess.run([*h.wrap, "nft", "list", "tables"], capture_output=True, text=True).stdout
              for h in net.hosts]
    assert not any(nemesis.TABLE in t for t in tables)
