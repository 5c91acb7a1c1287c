"""The runtime config keys (libs/proto/runtime_keys.py): clustermgr's /config/set takes exactly the keys of the table
with the values their parsers take, and `blobstore config set --help` documents every one of them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

import httpx
import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from blobstore_server.cli.cli import app as cli
from blobstore_server.libs.proto.clustermgr import POLICY_KEY, KeyValue, Session
from blobstore_server.libs.proto.runtime_keys import RUNTIME_KEYS, check_runtime_value
from blobstore_server.libs.proto.scheduler import BROKEN_AFTER_KEY
from blobstore_server.libs.proto.switches import OFF, TaskType, switch_key
from blobstore_server.services.clustermgr.app import build_app
from blobstore_server.services.clustermgr.manager import ClusterManager

GOOD = {POLICY_KEY: '[{"code_mode": "EC3P3", "min_volumes": 1}]', BROKEN_AFTER_KEY: "60",
        **{switch_key(task): OFF for task in TaskType}}
BAD = {POLICY_KEY: '[{"code_mode": "EC9P9"}]', BROKEN_AFTER_KEY: "-1",
       **{switch_key(task): "false" for task in TaskType}}


@pytest.mark.parametrize("key", sorted(RUNTIME_KEYS))
def test_every_key_takes_a_good_value_and_refuses_a_bad_one(key: str) -> None:
    check_runtime_value(key, GOOD[key])
    with pytest.raises(ValueError) as refused:
        check_runtime_value(key, BAD[key])
    assert "unknown config key" not in str(refused.value)


def test_an_unknown_key_is_refused_naming_every_known_one() -> None:
    with pytest.raises(ValueError, match="unknown config key 'switch/scrub'") as refused:
        check_runtime_value("switch/scrub", "on")
    assert all(key in str(refused.value) for key in RUNTIME_KEYS)


def test_the_help_of_config_set_lists_every_key_with_its_doc() -> None:
    shown = CliRunner().invoke(cli, ["config", "set", "--help"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())  # as rich wrapped it
    for key in RUNTIME_KEYS.values():
        assert f"{key.name}: {' '.join(key.doc.split())}" in text


class _Committed:
    """Stands in for clustermgr's manager: records what /config/set commits."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(volume_lease_ttl=30.0, disk_heartbeat_timeout=30.0, fault_hooks=False)
        self.committed: list[BaseModel] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def submit(self, command: BaseModel, _: Session | None) -> BaseModel:
        self.committed.append(command)
        return KeyValue.model_validate(command.model_dump())


def test_config_set_commits_a_known_key_and_refuses_the_rest_with_400() -> None:
    manager = _Committed()

    async def set_config(key: str, value: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(cast(ClusterManager, manager)))
        async with httpx.AsyncClient(transport=transport, base_url="http://cm") as http:
            return await http.post("/config/set", json={"key": key, "value": value})

    done = asyncio.run(set_config(BROKEN_AFTER_KEY, GOOD[BROKEN_AFTER_KEY]))
    assert done.status_code == 200 and done.json() == {"key": BROKEN_AFTER_KEY, "value": "60"}
    unknown = asyncio.run(set_config("balance", "false"))
    assert unknown.status_code == 400 and all(key in unknown.json()["error"] for key in RUNTIME_KEYS)
    bad = asyncio.run(set_config(BROKEN_AFTER_KEY, "-1"))
    assert bad.status_code == 400 and "must be positive" in bad.json()["error"]
    assert [(c.key, c.value) for c in manager.committed] == [(BROKEN_AFTER_KEY, "60")]  # type: ignore[attr-defined]
