"""Clusters started by `cluster up` (blobstore_server.cluster.launcher), shared by the test modules that ask for the
same shape: a module names its `LAUNCH` and takes the `cluster` fixture (tests/conftest.py). Modules of one shape
run side by side (the conftest orders them so), and a cluster is stopped as soon as the last of them is done, so at
most one runs at a time and none idles beside another test."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from blobstore_server.cluster.launcher import ClusterInfo, down, up
from blobstore_server.cluster.plan import ClusterShape
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc import client as rpc_client
from blobstore_server.libs.rpc.auth import Signer


@dataclass(frozen=True)
class Launch:
    """What `cluster up` is asked for. A module that changes its cluster for good (switches, restarts with another
    config) names itself as `owner`, so that no other module is handed the changed cluster."""
    shape: ClusterShape = field(default_factory=ClusterShape)
    hosts: int = 0
    timeout: float = 60.0
    owner: str = ""


class LaunchedClusters:
    """The one running launched cluster, by the Launch it was started for."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.current: tuple[Launch, ClusterInfo] | None = None
        self.started = 0
        self.signer_before: Signer | None = None  # `up` installs the cluster's operator signer while it runs
        self.said: list[str] = []  # what `up` said while starting the current one

    def get(self, launch: Launch) -> ClusterInfo:
        if self.current is not None and self.current[0] == launch:
            return self.current[1]
        self.stop()
        self.started += 1
        root = self.base / f"launched{self.started}"
        shutil.rmtree(root, ignore_errors=True)
        self.signer_before = auth.installed()
        self.said = []
        info = up(root, launch.shape, hosts=launch.hosts, timeout=launch.timeout,  # stops what it began on failure
                  say=self.said.append)
        self.current = (launch, info)
        return info

    def stop(self) -> None:
        if self.current is None:
            return
        root = Path(self.current[1].dir)
        self.current = None
        try:
            if (root / "cluster.json").exists():
                down(root)
        finally:
            auth.install(self.signer_before)
            rpc_client.trust(None)  # `up` trusted its CA while it ran


SIX_HOSTS = 6 if os.geteuid() == 0 else 0  # hosts as network namespaces need root
SMALL = Launch(ClusterShape(blobnodes=6, disks_per_node=1, delete_delay=1.0), hosts=SIX_HOSTS)
"""Six blobnodes of one disk on six hosts, deletes reclaimed after a second: the modules that leave it as they found it
share it."""
