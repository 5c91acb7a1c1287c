"""Network faults between the hosts of a `cluster up --hosts` cluster, the way Jepsen's nemesis makes them.

A cut is a "grudge" kept by the host that suffers it: an nftables table `blobstore_nemesis` inside the host's
namespace, whose set `deny` lists the addresses it no longer hears (input) and, for a two-way cut, no longer
reaches (output). Only that namespace is touched, so a heal is deleting the table; `heal_all` deletes it in every
namespace of the network whatever made it (a test killed mid-cut leaves nothing behind once it runs).
`isolate` pulls the host's cable instead (its bridge-side link down). Needs root and nft.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable

from blobstore.netns import NetHost, NetnsError, Network, namespaces, set_link

TABLE = "blobstore_nemesis"


def _nft(host: NetHost, script: str) -> None:
    """Apply `script` atomically inside the host's namespace (`nft -f -`)."""
    done = subprocess.run(["ip", "netns", "exec", host.namespace, "nft", "-f", "-"], input=script,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsError(f"nft in {host.namespace}: {done.stderr.strip()}")


def _has_table(namespace: str) -> bool:
    done = subprocess.run(["ip", "netns", "exec", namespace, "nft", "list", "table", "inet", TABLE],
                          capture_output=True, text=True)
    return done.returncode == 0


def _grudge(host: NetHost, addresses: Iterable[str], both_ways: bool) -> None:
    """`host` drops what comes from `addresses` (and, both ways, what it sends to them), on top of any cut it
    already has. Established connections die too: nothing is exempted (no conntrack accept)."""
    elements = ", ".join(sorted(set(addresses)))
    if not elements:
        return
    outgoing = f"add chain inet {TABLE} out {{ type filter hook output priority -10; policy accept; }}\n" \
               f"add rule inet {TABLE} out ip daddr @deny drop\n" if both_ways else ""
    fresh = not _has_table(host.namespace)
    script = (f"add table inet {TABLE}\n"
              f"add set inet {TABLE} deny {{ type ipv4_addr; }}\n"
              f"add chain inet {TABLE} in {{ type filter hook input priority -10; policy accept; }}\n")
    if fresh:
        script += f"add rule inet {TABLE} in ip saddr @deny drop\n"
    if both_ways and (fresh or not _has_chain(host, "out")):
        script += outgoing
    _nft(host, script + f"add element inet {TABLE} deny {{ {elements} }}\n")


def _has_chain(host: NetHost, chain: str) -> bool:
    done = subprocess.run(["ip", "netns", "exec", host.namespace, "nft", "list", "chain", "inet", TABLE, chain],
                          capture_output=True, text=True)
    return done.returncode == 0


def addresses_of(net: Network, peers: Iterable[str]) -> list[str]:
    """Host names -> addresses; "root" names the root namespace (the CLI, the SDK, a test's clients)."""
    return [net.gateway if p == "root" else net.host(p).address for p in peers]


def cut(net: Network, host: str, peers: Iterable[str]) -> None:
    """No packet between `host` and any of `peers`, either way (each side keeps the grudge, so a one-way cut
    elsewhere is not healed by it)."""
    peers = list(peers)
    _grudge(net.host(host), addresses_of(net, peers), both_ways=True)
    for peer in peers:
        if peer != "root":
            _grudge(net.host(peer), [net.host(host).address], both_ways=True)


def cut_one_way(net: Network, host: str, peers: Iterable[str]) -> None:
    """`host` stops hearing `peers`; what it sends still arrives (TCP then stalls either way, after its
    retransmissions: the asymmetric case Jepsen found leaders surviving in)."""
    _grudge(net.host(host), addresses_of(net, peers), both_ways=False)


def isolate(net: Network, host: str) -> None:
    """The host's cable pulled: no frame in or out, to anyone, the root namespace included."""
    set_link(net.host(host), up=False)


def heal(net: Network, host: str) -> None:
    """Undo every cut `host` keeps and plug its cable back in; idempotent. A peer's grudge against it stays:
    heal both sides of a two-way cut, or use `heal_all`."""
    h = net.host(host)
    if _has_table(h.namespace):
        _nft(h, f"delete table inet {TABLE}\n")
    set_link(h, up=True)
    subprocess.run(["ip", "-n", h.namespace, "neigh", "flush", "dev", "eth0"], capture_output=True)


def heal_all(net: Network) -> None:
    """Every host of the network healed, also of cuts a killed test left behind."""
    present = set(namespaces())
    for h in net.hosts:
        if h.namespace in present:
            heal(net, h.name)
