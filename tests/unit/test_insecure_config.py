"""Which service settings may start: keys, or `insecure: true` said out loud, never neither nor both; and no key the
config's model does not know. And what every service's settings set up in its process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pytest import MonkeyPatch

from blobstore_server.cluster.plan import ROLES
from blobstore_server.cluster.service_auth import role_auth, with_auth
from blobstore_server.libs.rpc.auth import AuthConfig, new_secret
from blobstore_server.libs.rpc.config import ServiceSettings, auth_problem, unknown_keys
from blobstore_server.libs.rpc.routes import NO_ROUTES, Capability
from blobstore_server.libs.rpc.server import run_service
from blobstore_server.services.clustermgr.config import ClusterMgrConfig


def test_only_auth_or_insecure_alone_may_start() -> None:
    keys = AuthConfig.for_capabilities(new_secret(), [Capability.OBSERVE])
    assert auth_problem(ServiceSettings(auth=keys), "a.json", "worker") is None
    assert auth_problem(ServiceSettings(insecure=True), "a.json", "worker") is None
    neither = auth_problem(ServiceSettings(), "conf/a.json", "worker")
    assert neither is not None and "conf/a.json" in neither and "blobstore auth config worker" in neither
    assert '"insecure": true' in neither and "\n" not in neither
    both = auth_problem(ServiceSettings(auth=keys, insecure=True), "a.json", "worker")
    assert both is not None and "both" in both


MEMBERS = {"1": {"raft_addr": "h:1", "http_addr": "h:2"}}


@pytest.mark.parametrize(("role", "config", "left_open"), [
    ("clustermgr", {"node_id": 1, "data_dir": "/d", "members": MEMBERS}, "raft-member"),
    ("tinker", {"clustermgr_hosts": ["http://cm"], "kafka_auth": {"username": "u", "password": "p"}}, "message_key"),
    ("mqproxy", {"clustermgr_hosts": ["http://cm"], "message_key": "ab" * 32}, "kafka_auth"),
])
def test_auth_with_another_link_left_open_starts_only_when_insecure_says_so(role: str, config: dict[str, object],
                                                                           left_open: str) -> None:
    """A clustermgr whose Raft port takes any peer, a tinker or mqproxy with unsealed messages or a Kafka without a
    login: refused with the reason, unless `insecure: true` (then logged, /health and the dashboard say so)."""
    keys = AuthConfig.for_capabilities(new_secret(), [Capability.OBSERVE])  # clustermgr's without raft-member
    model = next(model for model, name in ROLES.items() if name == role)
    refused = auth_problem(model.model_validate({**config, "auth": keys}), "a.json", role)
    assert refused is not None and left_open in refused and '"insecure": true' in refused
    assert auth_problem(model.model_validate({**config, "auth": keys, "insecure": True}), "a.json", role) is None
    secured = with_auth(new_secret(), role, {**config, "insecure": True})  # what `blobstore auth config` writes
    closes_all = role != "mqproxy"  # the key and message key are derived; a Kafka login is the operator's to give
    assert ("insecure" not in secured) is closes_all
    assert auth_problem(model.model_validate(secured), "a.json", role) is None


def test_role_auth_names_a_blobnode_by_its_advertised_host() -> None:
    secret = new_secret()
    by_bind = role_auth(secret, "blobnode", {"bind_addr": "127.0.0.1:9"})
    assert by_bind["identity"]["name"] == "http://127.0.0.1:9"
    assert role_auth(secret, "blobnode", {"bind_addr": "0.0.0.0:9", "host": "http://h:9"})["identity"]["name"] == \
        "http://h:9"
    cm = role_auth(secret, "clustermgr", {})
    assert cm["identities"] and "identity" not in cm
    assert set(role_auth(secret, "dashboard", {})["keys"]) == {"observe"}
    assert "insecure" not in with_auth(secret, "dashboard", {"insecure": True, "bind_addr": "x"})


def test_unknown_keys_are_found_at_any_depth_with_a_close_known_name() -> None:
    raw = {"node_id": 1, "data_dir": "/d", "heartbeat_ms": 50, "limits": {"client_burst": 5, "client_brust": 5},
           "members": {"1": {"raft_addr": "h:1", "http_addr": "h:2", "raft_adr": "h:1"}}, "zzz": 1}
    config = ClusterMgrConfig.model_validate(raw)
    assert unknown_keys(raw, config) == ["`limits.client_brust` (did you mean `client_burst`?)",
                                         "`members.1.raft_adr` (did you mean `raft_addr`?)", "`zzz`"]
    known = {"node_id": 1, "data_dir": "/d", "members": {"1": {"raft_addr": "h:1", "http_addr": "h:2"}}}
    assert unknown_keys(known, ClusterMgrConfig.model_validate(known)) == []


def test_a_service_hands_the_gil_on_as_often_as_its_config_says(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    """Python's 5 ms default let a disk or codec thread hold up the event loop that serves users."""
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"gil_switch_ms": 0.25}))  # neither auth nor insecure: it stops before serving
    monkeypatch.setattr(sys, "argv", ["worker", "-c", str(config)])
    before = sys.getswitchinterval()
    try:
        with pytest.raises(SystemExit, match="refusing to start"):
            run_service("worker", ServiceSettings, lambda _: pytest.fail("must not build"), routes=NO_ROUTES)
        assert sys.getswitchinterval() == pytest.approx(0.00025)
        assert ServiceSettings().gil_switch_ms == 0.5
    finally:
        sys.setswitchinterval(before)
