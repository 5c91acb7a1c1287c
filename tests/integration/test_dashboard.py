"""The dashboard scrapes every process only while someone looks at it: a scrape costs the scraped process CPU that
a loaded process on the same box misses. Real clustermgr, blobnode and dashboard processes; what the dashboard
asks for is read from the scraped processes' own request counters."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import insecure_fixtures
from tests.support.metrics import sample
from tests.support.processes import BlobnodeFactory, Service, free_port, stop_all

LINGER = 2.0  # the dashboard's watch_linger
INTERVAL = 0.2  # its scrape_interval


def scrapes(url: str) -> float:
    """GETs of `url`'s /metrics answered so far (this read is counted by the next one)."""
    return sample(url, "blobstore_http_requests_total", {"route": "/metrics", "method": "GET", "status": "200"})


@pytest.fixture
def dashboard(request: pytest.FixtureRequest, tmp_path: Path,
              clustermgr_factory: Callable[..., list[Service]]) -> Iterator[tuple[Service, Service]]:
    (cm,) = clustermgr_factory(count=1)
    port = free_port()
    workdir = tmp_path / "dashboard"
    workdir.mkdir()
    config = {"bind_addr": f"127.0.0.1:{port}", "clustermgr_hosts": [cm.url], "scrape_interval": INTERVAL,
              "watch_linger": LINGER, "targets": [{"name": "cm1", "role": "clustermgr", "url": cm.url}]}
    service = Service("dashboard", config, workdir, f"http://127.0.0.1:{port}", insecure=insecure_fixtures(request))
    try:
        yield service.start(), cm
    finally:
        stop_all([service])


def test_the_dashboard_scrapes_only_while_watched(dashboard: tuple[Service, Service],
                                                  blobnode_factory: BlobnodeFactory) -> None:
    board, cm = dashboard
    blobnode = blobnode_factory("bn", disks=1, clustermgr=[cm])
    before = scrapes(cm.url), scrapes(blobnode.url)
    time.sleep(5 * INTERVAL)
    assert (scrapes(cm.url) - before[0], scrapes(blobnode.url) - before[1]) == (1, 1)  # only this test's reads

    # the first view waits for a fresh round: the blobnode, known only from clustermgr's disk table, is in it
    view = httpx.get(f"{board.url}/api/overview", timeout=10).json()
    assert {p["name"]: p["up"] for p in view["processes"]}["cm1"]
    assert [b["up"] for b in view["blobnodes"]] == [True]
    assert [len(b["disks"]) for b in view["blobnodes"]] == [1]

    watched = scrapes(cm.url), scrapes(blobnode.url)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # a page open: it asks every second or so
        httpx.get(f"{board.url}/api/overview", timeout=10).raise_for_status()
        time.sleep(0.3)
    assert scrapes(cm.url) - watched[0] >= 3 and scrapes(blobnode.url) - watched[1] >= 3

    time.sleep(LINGER + 2 * INTERVAL)  # the page closed: scraping stops once the linger is over
    quiet = scrapes(cm.url), scrapes(blobnode.url)
    time.sleep(5 * INTERVAL)
    assert (scrapes(cm.url) - quiet[0], scrapes(blobnode.url) - quiet[1]) == (1, 1)
