"""Free ports: one process never hands the same port out twice (a taker may not have bound it yet)."""

from __future__ import annotations

from blobstore_server.libs.ports import free_port, free_ports


def test_ports_are_never_handed_out_twice_by_one_process() -> None:
    drawn = [free_port() for _ in range(400)] + free_ports(100)
    assert len(set(drawn)) == len(drawn)  # 500 random draws from ~20,000 ports would repeat ~99% of the time
