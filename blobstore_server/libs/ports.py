"""Free TCP ports for processes about to listen on 127.0.0.1 (tests, the launcher, benchmarks)."""

from __future__ import annotations

import os
import random
import socket
import time
from contextlib import ExitStack
from pathlib import Path


def _listen_range() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range: an outgoing connection never takes one of these between
    the moment it is found free and the moment the process it is meant for binds it."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    return (10_000, ephemeral_low) if ephemeral_low > 12_000 else (1024, ephemeral_low)


_handed_out: set[int] = set()  # never handed out twice by one process: the first taker may not have bound it yet


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free right now (all held open together, so none repeats), drawn at random
    outside the ephemeral range, none of them handed out by this process before (CI once saw a clustermgr
    fail to bind a port an earlier draw had given to a process not yet listening)."""
    low, high = _listen_range()
    draw = random.Random(os.getpid() ^ time.time_ns())
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            port = draw.randrange(low, high)
            if port in _handed_out:
                continue
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind((host, port))
            except OSError:
                continue
            ports.append(port)
        _handed_out.update(ports)
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
