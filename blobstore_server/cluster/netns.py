"""Hosts as Linux network namespaces on one bridge: a multi-host cluster on one machine (`cluster up --hosts`).

Network `bs<k>` is the bridge `bs<k>-br` holding 10.77.<k>.1/24 (the root namespace's address, so the CLI,
the SDK and tests reach every host), and per host i the namespace `bs<k>-h<i>` with one address,
10.77.<k>.<10+i>, on a veth pair whose root end `bs<k>-h<i>` sits on the bridge. A process runs on host i
when started under `ip netns exec bs<k>-h<i>`. Everything is found by name, so what a killed launcher left
behind is removed by `destroy` all the same. Needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

SUBNET = "10.77"
PREFIX = re.compile(r"^bs(\d+)-")


class NetnsError(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2) or an `ip` command failed; the message says which."""


@dataclass(frozen=True)
class NetHost:
    name: str  # the spec's host name: h1, h2, ...
    namespace: str
    address: str

    @property
    def veth(self) -> str:
        """The root-side end of its link, on the bridge (pull it down to cut the host off)."""
        return self.namespace

    @property
    def wrap(self) -> tuple[str, ...]:
        """The argv prefix that runs a command on this host."""
        return ("ip", "netns", "exec", self.namespace)


@dataclass(frozen=True)
class Network:
    prefix: str  # bs<k>
    hosts: list[NetHost]

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def gateway(self) -> str:
        return f"{SUBNET}.{self.index}.1"

    @property
    def index(self) -> int:
        return int(self.prefix[2:])

    def host(self, name: str) -> NetHost:
        return next(h for h in self.hosts if h.name == name)


def plan_network(count: int, index: int) -> Network:
    """Hosts h1..h<count> of network bs<index>."""
    if not 1 <= count <= 200 or not 1 <= index <= 254:
        raise NetnsError(f"between 1 and 200 hosts on network 1..254, not {count} on {index}")
    prefix = f"bs{index}"
    return Network(prefix, [NetHost(f"h{i}", f"{prefix}-h{i}", f"{SUBNET}.{index}.{10 + i}")
                            for i in range(1, count + 1)])


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def require_root() -> None:
    if os.geteuid() != 0:
        raise NetnsError("hosts as network namespaces need root (CAP_NET_ADMIN); without root run plain "
                         "`blobstore cluster up`, which puts every process on 127.0.0.1")
    if subprocess.run(["ip", "-V"], capture_output=True).returncode != 0:
        raise NetnsError("`ip` (iproute2) is missing: make setup installs it")


def namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def in_use() -> set[int]:
    """Indexes of networks present now: their namespaces or bridge exist."""
    return {int(m.group(1)) for name in namespaces() + _link_names() if (m := PREFIX.match(name))}


def free_index() -> int:
    taken = in_use()
    return next(k for k in range(1, 255) if k not in taken)


def create(net: Network) -> None:
    """The bridge and every host's namespace, link and address; whatever of `net` existed is removed first."""
    destroy(net.prefix)
    _ip("link", "add", net.bridge, "type", "bridge")
    _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
    _ip("link", "set", net.bridge, "up")
    for h in net.hosts:
        _ip("netns", "add", h.namespace)
        _ip("link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.namespace)
        _ip("link", "set", h.veth, "master", net.bridge, "up")
        _ip("-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", "eth0")
        _ip("-n", h.namespace, "link", "set", "eth0", "up")
        _ip("-n", h.namespace, "link", "set", "lo", "up")


def set_link(host: NetHost, up: bool) -> None:
    """Plug or pull the host's cable: its bridge-side link down drops every frame to and from it, open
    connections stall and new ones fail, as when a machine drops off the network."""
    _ip("link", "set", host.veth, "up" if up else "down")


def pids(namespace: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", namespace, check=False).split()]


def destroy(prefix: str, timeout: float = 10.0) -> list[int]:
    """Kill every process still in a namespace of network `prefix`, delete the namespaces and the bridge, and
    wait until the kernel has removed their links; returns the pids it had to kill."""
    ours = [ns for ns in namespaces() if ns.startswith(f"{prefix}-")]
    killed = [pid for ns in ours for pid in pids(ns)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for ns in ours:
        _ip("netns", "del", ns, check=False)
    _ip("link", "del", f"{prefix}-br", check=False)
    deadline = time.monotonic() + timeout
    while _links(prefix):  # a namespace's links go once its last process is gone, asynchronously
        if time.monotonic() > deadline:
            raise NetnsError(f"links of {prefix} still there after {timeout}s: {', '.join(_links(prefix))}")
        for name in _links(prefix):
            _ip("link", "del", name, check=False)
        time.sleep(0.1)
    return killed


def _link_names() -> list[str]:
    """Every link of the root namespace ("7: bs1-h2@if2: <...>" lines)."""
    return [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", "show").splitlines()
            if line.count(":") >= 2]


def _links(prefix: str) -> list[str]:
    return [n for n in _link_names() if n.startswith(f"{prefix}-")]
