from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.processes import Service, free_port

BlobnodeFactory = Callable[..., Service]


@pytest.fixture
def blobnode_factory(tmp_path: Path) -> Iterator[BlobnodeFactory]:
    """Start real blobnode processes; every one is stopped by PID at teardown."""
    started: list[Service] = []

    def start(name: str = "bn", disks: int = 2, first_disk_id: int = 1, **overrides: object) -> Service:
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        port = free_port()
        config = {
            "bind_addr": f"127.0.0.1:{port}",
            "cluster_id": 1,
            "disks": [{"path": str(workdir / f"disk{i}"), "disk_id": first_disk_id + i} for i in range(disks)],
            **overrides,
        }
        service = Service("services.blobnode", config, workdir, f"http://127.0.0.1:{port}")
        started.append(service)
        return service.start()

    yield start
    for service in started:
        service.stop()
