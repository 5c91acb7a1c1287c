"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore_server.services.clustermgr.machine import ClusterMachine
from tests.support.clustermgr_state import Driver


@pytest.fixture
def cm(tmp_path: Path) -> Iterator[Driver]:
    state = ClusterMachine(tmp_path / "state")
    yield Driver(state)
    state.close()
