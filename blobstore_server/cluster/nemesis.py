"""Network faults between the hosts of a `cluster up --hosts` cluster, the way Jepsen's nemesis makes them.

A cut is a "grudge" kept by the host that suffers it: an nftables table `blobstore_nemesis` inside the host's
namespace, whose sets list the addresses it no longer hears (input) and, for a two-way cut, no longer
reaches (output), or single services of a peer (address and TCP port) it no longer reaches. Only that
namespace is touched, so a heal is deleting the table; `heal_all` deletes it in every namespace of the network
whatever made it (a test killed mid-cut leaves nothing behind once it runs).
`isolate` pulls the host's cable instead (its bridge-side link down). Needs root and nft.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable

from blobstore_server.cluster.netns import NetHost, NetnsError, Network, namespaces, set_link

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


def _table(host: NetHost) -> str:
    """The script that makes the nemesis table in `host`'s namespace unless it is there: addresses it no longer
    hears (`deny`), no longer reaches (`deny_out`), and peers' services it no longer reaches (`deny_port`)."""
    if _has_table(host.namespace):
        return ""
    return (f"add table inet {TABLE}\n"
            f"add set inet {TABLE} deny {{ type ipv4_addr; }}\n"
            f"add set inet {TABLE} deny_out {{ type ipv4_addr; }}\n"
            f"add set inet {TABLE} deny_port {{ type ipv4_addr . inet_service; }}\n"
            f"add chain inet {TABLE} in {{ type filter hook input priority -10; policy accept; }}\n"
            f"add chain inet {TABLE} out {{ type filter hook output priority -10; policy accept; }}\n"
            f"add rule inet {TABLE} in ip saddr @deny drop\n"
            f"add rule inet {TABLE} in ip saddr . tcp sport @deny_port drop\n"
            f"add rule inet {TABLE} out ip daddr @deny_out drop\n"
            f"add rule inet {TABLE} out ip daddr . tcp dport @deny_port drop\n")


def _grudge(host: NetHost, sets: dict[str, Iterable[str]]) -> None:
    """Add `elements` to the named sets of `host`'s nemesis table, on top of any cut it already has.
    Established connections die too: nothing is exempted (no conntrack accept)."""
    script = _table(host)
    for name, elements in sets.items():
        listed = ", ".join(sorted(set(elements)))
        if listed:
            script += f"add element inet {TABLE} {name} {{ {listed} }}\n"
    _nft(host, script)


def addresses_of(net: Network, peers: Iterable[str]) -> list[str]:
    """Host names -> addresses; "root" names the root namespace (the CLI, the SDK, a test's clients)."""
    return [net.gateway if p == "root" else net.host(p).address for p in peers]


def cut(net: Network, host: str, peers: Iterable[str]) -> None:
    """No packet between `host` and any of `peers`, either way (each side keeps the grudge, so a one-way cut
    elsewhere is not healed by it)."""
    peers = list(peers)
    addresses = addresses_of(net, peers)
    _grudge(net.host(host), {"deny": addresses, "deny_out": addresses})
    for peer in peers:
        if peer != "root":
            _grudge(net.host(peer), {"deny": [net.host(host).address], "deny_out": [net.host(host).address]})


def cut_one_way(net: Network, host: str, peers: Iterable[str]) -> None:
    """`host` stops hearing `peers`; what it sends still arrives (TCP then stalls either way, after its
    retransmissions: the asymmetric case Jepsen found leaders surviving in)."""
    _grudge(net.host(host), {"deny": addresses_of(net, peers)})


def cut_services(net: Network, host: str, services: Iterable[tuple[str, int]]) -> None:
    """`host` no longer reaches these (peer host, TCP port) services, nor hears their answers; everything else
    between them still flows, as when a firewall rule or a routing fault hides some processes of a machine
    but not others (access cut from clustermgr and the allocators, not from the blobnodes beside them)."""
    elements = [f"{address} . {port}" for (peer, port) in services for address in addresses_of(net, [peer])]
    _grudge(net.host(host), {"deny_port": elements})


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
