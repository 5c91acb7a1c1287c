"""Reading what tcpdump captured (classic pcap, Ethernet frames, IPv4): each TCP flow's bytes per direction, and
the UDP payloads, so a test can look for plaintext in them."""

from __future__ import annotations

import ipaddress
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ETHERTYPE_IPV4 = 0x0800
TCP, UDP = 6, 17
SYN, ACK = 0x02, 0x10


@dataclass
class Flow:
    """One TCP connection's bytes in each direction, in capture order, and whether its opening was seen."""

    client: tuple[str, int]
    server: tuple[str, int]
    opened: bool = False  # its SYN was captured: the stream below starts at its first byte
    sent: bytearray = field(default_factory=bytearray)  # client -> server
    answered: bytearray = field(default_factory=bytearray)  # server -> client


@dataclass
class Capture:
    flows: list[Flow]
    datagrams: list[bytes]  # UDP payloads


def _frames(raw: bytes) -> list[bytes]:
    magic = struct.unpack("<I", raw[:4])[0]
    order = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    assert struct.unpack(order + "I", raw[20:24])[0] == 1, "not an Ethernet capture"
    frames, at = [], 24
    while at + 16 <= len(raw):
        caplen = struct.unpack(order + "I", raw[at + 8:at + 12])[0]
        frames.append(raw[at + 16:at + 16 + caplen])
        at += 16 + caplen
    return frames


def read(path: Path) -> Capture:
    """The capture at `path` (tcpdump -w, snaplen 0: whole frames), retransmitted segments kept as they came."""
    flows: dict[tuple[tuple[str, int], tuple[str, int]], Flow] = {}
    datagrams: list[bytes] = []
    for frame in _frames(path.read_bytes()):
        if len(frame) < 34 or struct.unpack("!H", frame[12:14])[0] != ETHERTYPE_IPV4:
            continue
        ip = frame[14:]
        header = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        proto = ip[9]
        src, dst = str(ipaddress.IPv4Address(ip[12:16])), str(ipaddress.IPv4Address(ip[16:20]))
        body = ip[header:total]
        if proto == UDP:
            datagrams.append(body[8:])
        if proto != TCP:
            continue
        sport, dport = struct.unpack("!HH", body[:4])
        offset, flags = (body[12] >> 4) * 4, body[13]
        payload = body[offset:]
        a, b = (src, sport), (dst, dport)
        if flags & SYN and not flags & ACK:
            flows[(a, b)] = Flow(a, b, opened=True)
        flow = flows.get((a, b)) or flows.get((b, a))
        if flow is None:
            flow = flows[(a, b)] = Flow(a, b)  # opened before the capture: who dialed is unknown
        (flow.sent if (a, b) == (flow.client, flow.server) else flow.answered).extend(payload)
    return Capture(list(flows.values()), datagrams)


def by_port(capture: Capture) -> dict[int, list[Flow]]:
    """The flows the capture saw open, by the port they dialed."""
    ports: dict[int, list[Flow]] = defaultdict(list)
    for flow in capture.flows:
        if flow.opened:
            ports[flow.server[1]].append(flow)
    return ports
