"""No silent insecure mode: a service whose config has no `auth` refuses to start unless it says `insecure: true`;
then it warns in its log, its /health says so and the dashboard names it in a red INSECURE badge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from blobstore_server.libs.rpc.auth import AuthConfig, new_secret
from blobstore_server.libs.rpc.routes import Capability
from tests.support.browser import headless_chromium
from tests.support.processes import REPO, BlobnodeFactory, Service, free_port, wait_until


def exit_of(tmp_path: Path, config: dict[str, object], role: str = "blobnode") -> subprocess.CompletedProcess[str]:
    """Start a `role` process with exactly `config` and wait for it to exit (it must, at once)."""
    path = tmp_path / "conf.json"
    path.write_text(json.dumps(config))
    return subprocess.run([sys.executable, "-m", f"blobstore_server.services.{role}", "-c", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=30)


def bare_blobnode(tmp_path: Path) -> dict[str, object]:
    return {"bind_addr": f"127.0.0.1:{free_port()}", "disks": [{"path": str(tmp_path / "disk1"), "disk_id": 1}]}


def test_no_auth_and_not_insecure_refuses_to_start(tmp_path: Path) -> None:
    done = exit_of(tmp_path, bare_blobnode(tmp_path))
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert str(tmp_path / "conf.json") in line and "no `auth`" in line and '"insecure": true' in line, done.stderr
    assert not (tmp_path / "disk1").exists() or not any((tmp_path / "disk1").iterdir())  # nothing was served


def test_a_config_typo_refuses_to_start_naming_the_key_the_file_and_a_close_name(tmp_path: Path) -> None:
    keys = AuthConfig.for_capabilities(new_secret(), [Capability.OBSERVE]).model_dump(mode="json", exclude_none=True)
    config = bare_blobnode(tmp_path)
    config["disks"] = [{"path": str(tmp_path / "disk1"), "disk_id": 1, "reserved_byts": 1 << 20}]
    done = exit_of(tmp_path, {**config, "auth": keys, "scrub_perod": 60})
    assert done.returncode != 0
    message = done.stderr.strip()
    assert str(tmp_path / "conf.json") in message and "unknown keys" in message, done.stderr
    assert "`scrub_perod` (did you mean `scrub_period`?)" in message, done.stderr
    assert "`disks[0].reserved_byts`" in message, done.stderr
    assert not (tmp_path / "disk1").exists() or not any((tmp_path / "disk1").iterdir())


def test_auth_and_insecure_together_refuse_to_start(tmp_path: Path) -> None:
    keys = AuthConfig.for_capabilities(new_secret(), [Capability.OBSERVE]).model_dump(mode="json", exclude_none=True)
    done = exit_of(tmp_path, {**bare_blobnode(tmp_path), "auth": keys, "insecure": True})
    assert done.returncode != 0
    assert "both `auth` and" in done.stderr.strip().splitlines()[-1], done.stderr


@pytest.mark.insecure  # this test is about the insecure mode
def test_insecure_warns_reports_in_health_and_the_dashboard_badge(blobnode_factory: BlobnodeFactory,
                                                                   tmp_path: Path) -> None:
    open_node = blobnode_factory("open")
    assert open_node.config["insecure"] is True and "auth" not in open_node.config
    assert httpx.get(f"{open_node.url}/health").json() == {"status": "ok", "insecure": True}
    warning = [line for line in open_node.log_path.read_text().splitlines() if "INSECURE" in line]
    assert warning and "WARNING" in warning[0] and "every route is open" in warning[0]
    # A node with keys beside it (its /health says nothing of insecurity) and a dashboard watching both.
    (tmp_path / "signed").mkdir()
    config = bare_blobnode(tmp_path / "signed")
    signed_node = Service("blobnode", config, tmp_path / "signed", f"http://{config['bind_addr']}")
    dash_dir = tmp_path / "dashboard"
    dash_dir.mkdir()
    port = free_port()
    dashboard = Service("dashboard", {
        "bind_addr": f"127.0.0.1:{port}", "clustermgr_hosts": [signed_node.url], "scrape_interval": 0.5,
        "targets": [{"name": "open-node", "role": "blobnode", "url": open_node.url},
                    {"name": "signed-node", "role": "blobnode", "url": signed_node.url}]},
        dash_dir, f"http://127.0.0.1:{port}")
    try:
        signed_node.start()
        assert "auth" in signed_node.config
        assert httpx.get(f"{signed_node.url}/health").json() == {"status": "ok"}
        dashboard.start()
        overview = f"{dashboard.url}/api/overview"
        wait_until(lambda: httpx.get(overview).json()["insecure"] == ["open-node"], 15, "the dashboard to see it")
        with headless_chromium(tmp_path / "chromium-profile") as browser:
            browser.get(dashboard.url)
            badge = WebDriverWait(browser, 20, poll_frequency=0.2).until(
                lambda b: b.find_element(By.ID, "insecure") if b.find_element(By.ID, "insecure").is_displayed()
                else False)
            assert badge.text == "INSECURE: open-node"
            assert "bad" in (badge.get_attribute("class") or "").split()
            assert badge.value_of_css_property("background-color") == "rgba(255, 235, 233, 1)"  # the red of .bad
            row = browser.find_element(By.CSS_SELECTOR, '#processes tr[data-process="open-node"]')
            assert "INSECURE" in row.text
    finally:
        dashboard.stop()
        signed_node.stop()


def test_a_clustermgr_whose_raft_port_takes_any_peer_starts_only_when_insecure_says_so(tmp_path: Path) -> None:
    """Keys on its routes but none on its Raft transport: anyone reaching that port could vote or append."""
    secret = new_secret()
    keys = AuthConfig.for_capabilities(secret, [c for c in Capability if c != Capability.RAFT_MEMBER],
                                       verifies_identities=True).model_dump(mode="json", exclude_none=True)
    port = free_port()
    config = {"node_id": 1, "data_dir": str(tmp_path / "data"), "auth": keys,
              "members": {"1": {"raft_addr": f"127.0.0.1:{free_port()}", "http_addr": f"127.0.0.1:{port}"}}}
    done = exit_of(tmp_path, config, "clustermgr")
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert "raft-member" in line and '"insecure": true' in line, done.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())  # nothing was served

    (tmp_path / "open").mkdir()
    node = Service("clustermgr", {**config, "insecure": True}, tmp_path / "open", f"http://127.0.0.1:{port}")
    try:
        node.start()
        assert httpx.get(f"{node.url}/health").json() == {"status": "ok", "insecure": True}
        warning = [line for line in node.log_path.read_text().splitlines() if "INSECURE" in line]
        assert warning and "the Raft port takes any peer" in warning[0]
    finally:
        node.stop()
