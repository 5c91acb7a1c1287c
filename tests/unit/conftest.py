"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.clustermgr.state import ClusterState
from tests.support.clustermgr_state import Driver


@pytest.fixture
def cm(tmp_path: Path) -> Iterator[Driver]:
    state = ClusterState(tmp_path / "state")
    yield Driver(state)
    state.close()
