"""What an operator watches, against a real cluster started by the launcher (6 blobnodes x 1 disk, Kafka,
tinker, two allocators, two access nodes, a dashboard): every process's /metrics in Prometheus text, a real
Prometheus (Debian's) scraping them all, an access node's audit log, and the dashboard page loaded in headless
Chromium. What one access node counts is read from access1, with requests sent through it alone.

The browser test changes the cluster (a broken disk, tinker stopped), so it runs last.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from typer.testing import CliRunner

from blobstore import Client, Forbidden
from blobstore_server.cli.cli import app
from blobstore_server.cluster.launcher import ClusterInfo, ProcessRecord
from blobstore_server.cluster.procs import free_port, stop, wait_until
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.proto.mqproxy import RepairIn
from blobstore_server.libs.proto.routes import CATALOG
from blobstore_server.libs.proto.scheduler import TaskRecord, TaskState
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc import auth
from blobstore_server.libs.rpc.auth import AUTH_HEADER
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.mqproxy.client import MqProxyClient
from tests.support.browser import headless_chromium
from tests.support.damage import lose_shard
from tests.support.launched import SMALL, Launch, LaunchedClusters
from tests.support.metrics import sample

# The launched `cluster` (tests/conftest.py) on one host, its own: the dashboard test breaks a disk and stops tinker
LAUNCH = Launch(SMALL.shape, owner=__name__)

SCRAPED = ("clustermgr", "blobnode", "allocator", "scheduler", "worker", "mqproxy", "tinker", "access", "dashboard",
           "s3")
# Families each role must export beyond the shared request metrics.
OWN_FAMILIES = {
    "clustermgr": {"blobstore_raft_term", "blobstore_raft_role", "blobstore_raft_commit_index",
                   "blobstore_raft_applied_index", "blobstore_clustermgr_proposal_seconds",
                   "blobstore_clustermgr_volumes", "blobstore_clustermgr_disks"},
    "blobnode": {"blobstore_blobnode_shard_ops", "blobstore_blobnode_fsync_seconds",
                 "blobstore_blobnode_crc_failures", "blobstore_blobnode_disk_used_bytes",
                 "blobstore_blobnode_disk_free_bytes", "blobstore_blobnode_disk_io_pending",
                 "blobstore_blobnode_scrub_progress", "blobstore_blobnode_scrub_last_pass_timestamp_seconds",
                 "blobstore_blobnode_scrub_corrupt", "blobstore_blobnode_scrub_repairs_queued"},
    "allocator": {"blobstore_allocator_leased_volumes", "blobstore_allocator_free_bids"},
    "scheduler": {"blobstore_scheduler_active", "blobstore_scheduler_tasks", "blobstore_scheduler_switch"},
    "worker": {"blobstore_worker_repaired_shards", "blobstore_worker_repairs_failed"},
    "mqproxy": {"blobstore_mqproxy_messages_in", "blobstore_mqproxy_messages_sent"},
    "tinker": {"blobstore_tinker_messages_in", "blobstore_tinker_done", "blobstore_tinker_failed",
               "blobstore_tinker_retried", "blobstore_tinker_kafka_lag"},
    "access": {"blobstore_access_bytes_in", "blobstore_access_bytes_out", "blobstore_access_put_quorum_misses",
               "blobstore_access_degraded_reads", "blobstore_access_hedged_reads"},
    "dashboard": set(),
    "s3": set(),  # its S3 requests count in the shared request metrics, route "S3 <operation>"
}
SHARED = {"blobstore_http_requests", "blobstore_http_request_duration_seconds", "blobstore_http_requests_in_flight",
          "blobstore_service_info"}


def _scraped(cluster: ClusterInfo) -> list[ProcessRecord]:
    return [p for p in cluster.processes if p.role in SCRAPED]


def _access1(cluster: ClusterInfo) -> str:
    """The first access node's URL: the one whose metrics and audit log these tests read."""
    return next(p.url for p in cluster.processes if p.name == "access1")


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a scrape by sample name, parsed by prometheus-client's own parser."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(f"family:{family.name}", [])
        for found in family.samples:
            out.setdefault(found.name, []).append((found.labels, found.value))
    return out


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> float:
    return sum(v for labels, v in samples.get(name, []) if all(labels.get(k) == m for k, m in match.items()))


def test_status_names_the_dashboard(cluster: ClusterInfo) -> None:
    result = CliRunner().invoke(app, ["cluster", "status", "--dir", cluster.dir, "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert status["dashboard"] == cluster.dashboard_url
    assert {p["name"]: p["healthy"] for p in status["processes"]}["dashboard"]
    page = httpx.get(cluster.dashboard_url, timeout=5)
    assert page.status_code == 200 and "<title>blobstore dashboard</title>" in page.text
    shown = CliRunner().invoke(app, ["cluster", "status", "--dir", cluster.dir])
    assert f"dashboard: {cluster.dashboard_url}" in shown.output


def test_every_process_serves_metrics_prometheus_can_parse(cluster: ClusterInfo) -> None:
    access1 = _access1(cluster)
    with Client([access1]) as client:
        data = os.urandom(300_000)
        token = client.put(data)
        assert client.get(token) == data
    assert httpx.get(f"{access1}/no/such/route", timeout=5).status_code == 404
    a_blobnode = next(p.url for p in cluster.processes if p.name == "blobnode1")
    query = {"disk_id": "999", "vuid": "1", "bid": "1"}
    signer = auth.installed()  # the launcher signs this process's requests as the operator
    assert signer is not None
    signature = {AUTH_HEADER: signer.header("GET", f"{a_blobnode}/shard/get", query, None, CATALOG)}
    missing_disk = httpx.get(f"{a_blobnode}/shard/get", params=query, headers=signature, timeout=5)
    assert missing_disk.status_code == 404
    texts = {p.name: httpx.get(f"{p.url}/metrics", timeout=5) for p in _scraped(cluster)}
    roles = {p.name: p.role for p in _scraped(cluster)}
    parsed = {}
    for name, response in texts.items():
        assert response.status_code == 200, name
        assert response.headers["content-type"].startswith("text/plain"), name
        assert token not in response.text, f"{name} put a location token in a label"
        parsed[name] = _samples(response.text)
        families = {k.removeprefix("family:") for k in parsed[name] if k.startswith("family:")}
        missing = (SHARED | OWN_FAMILIES[roles[name]]) - families
        assert not missing, f"{name} ({roles[name]}) lacks {sorted(missing)}"
        assert _total(parsed[name], "blobstore_service_info", service=roles[name]) == 1

    assert {n for n, role in roles.items() if role in {"access", "allocator"}} == {
        "access1", "access2", "allocator1", "allocator2"}
    access = parsed["access1"]
    assert _total(access, "blobstore_http_requests_total", route="/blob", method="PUT", status="200") >= 1
    assert _total(access, "blobstore_http_requests_total", route="/blob/{token}", method="GET", status="200") >= 1
    assert _total(access, "blobstore_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert _total(access, "blobstore_http_request_duration_seconds_count", route="/blob", method="PUT") >= 1
    assert _total(access, "blobstore_access_bytes_in_total") >= len(data)
    assert _total(access, "blobstore_access_bytes_out_total") >= len(data)
    routes = {labels["route"] for labels, _ in access["blobstore_http_requests_total"]}
    assert routes <= {"/blob", "/blob/{token}", "/blob/{token}/stat", "/health", "/metrics", "unmatched"}, routes

    blobnodes = [parsed[n] for n, role in roles.items() if role == "blobnode"]
    assert sum(_total(b, "blobstore_http_requests_total", route="/shard/put", method="PUT", status="200")
               for b in blobnodes) >= 6  # the fast data-path route is measured too
    assert sum(_total(b, "blobstore_blobnode_shard_ops_total", op="put", result="ok") for b in blobnodes) >= 6
    refused = _total(parsed["blobnode1"], "blobstore_http_requests_total", route="/shard/get", status="404")
    assert refused == 1  # a fast route's error is counted with the status its client got
    assert sum(_total(b, "blobstore_blobnode_fsync_seconds_count") for b in blobnodes) >= 1
    assert all(_total(b, "blobstore_blobnode_disk_free_bytes") > 0 for b in blobnodes)

    managers = [parsed[n] for n, role in roles.items() if role == "clustermgr"]
    assert sum(_total(m, "blobstore_raft_role", role="leader") for m in managers) == 1
    assert all(_total(m, "blobstore_raft_term") >= 1 for m in managers)
    assert all(_total(m, "blobstore_clustermgr_disks", status="normal") == 6 for m in managers)
    leader = next(m for m in managers if _total(m, "blobstore_raft_role", role="leader") == 1)
    assert _total(leader, "blobstore_clustermgr_proposal_seconds_count", op="disk_heartbeat") >= 1
    assert _total(leader, "blobstore_clustermgr_volumes", status="active") >= 1
    allocators = [parsed[n] for n, role in roles.items() if role == "allocator"]  # either may have served the PUT
    assert sum(_total(a, "blobstore_allocator_free_bids") for a in allocators) > 0
    assert sum(_total(a, "blobstore_allocator_leased_volumes", code_mode="EC3P3") for a in allocators) >= 1


def test_a_degraded_read_is_counted(cluster: ClusterInfo) -> None:
    """A GET that finds a data shard gone is rebuilt from parity, and the access node that served it counts it."""
    access1 = _access1(cluster)
    with Client([access1]) as client:
        data = os.urandom(50_000)
        token = client.put(data)
        before = _samples(httpx.get(f"{access1}/metrics", timeout=5).text)
        blob = Location.from_token(token, _secret(cluster)).blobs[0]

        async def drop_shard_zero() -> None:
            async with ClusterClient(cluster.clustermgr_urls) as cm, BlobnodeClient() as blobnodes:
                unit = (await cm.get_volume(blob.vid)).units[0]
                await lose_shard(blobnodes, unit, blob.min_bid)

        asyncio.run(drop_shard_zero())
        assert client.get(token) == data
    after = _samples(httpx.get(f"{access1}/metrics", timeout=5).text)
    name = "blobstore_access_degraded_reads_total"
    assert _total(after, name) == _total(before, name) + 1


def _audit_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_audit_log_has_a_line_per_request(cluster: ClusterInfo) -> None:
    path = Path(cluster.dir) / "access1" / "audit.jsonl"  # each access node logs the requests it served
    before = len(_audit_lines(path))
    data = os.urandom(5 << 20)  # two blobs
    with Client([_access1(cluster)]) as client:
        token = client.put(data)
        assert client.get(token, 10, 100) == data[10:110]
        assert client.get(token) == data  # read from the blobnodes through a read plan
        client.stat(token)
        middle = len(token) // 2
        forged = token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1:]
        with pytest.raises(Forbidden):
            client.get(forged)
    location = Location.from_token(token, _secret(cluster))
    wait_until(lambda: len(_audit_lines(path)) >= before + 5, 10, "the audit lines")
    lines = _audit_lines(path)[before:]
    assert token not in path.read_text()
    assert all(line["path"] not in ("/metrics", "/health") for line in lines)
    by_kind = {(line["method"], line["path"], line["status"]): line for line in lines}
    put = by_kind["PUT", "/blob", 200]
    assert put["bytes_in"] == len(data) and put["vids"] == sorted({s.vid for s in location.blobs})
    assert put["cluster_id"] == location.cluster_id
    ranged = by_kind["GET", "/blob/{token}", 206]
    assert ranged["bytes_out"] == 100 and ranged["vids"] == put["vids"] and ranged["bytes_planned"] == 0
    planned = by_kind["GET", "/blob/{token}", 200]
    assert planned["bytes_planned"] == len(data) and 0 < int(str(planned["bytes_out"])) < 64 << 10
    assert by_kind["GET", "/blob/{token}/stat", 200]["vids"] == put["vids"]
    refused = by_kind["GET", "/blob/{token}", 403]
    assert refused["vids"] is None and refused["cluster_id"] is None
    for line in lines:
        assert set(line) == {"time", "method", "path", "status", "bytes_in", "bytes_out", "bytes_planned",
                             "latency_ms", "client", "cluster_id", "vids"}
        assert str(line["client"]).startswith("127.0.0.1:") and float(str(line["latency_ms"])) >= 0
        assert str(line["time"]).endswith("Z")


def _secret(cluster: ClusterInfo) -> bytes:
    access = next(p for p in cluster.processes if p.name == "access1")  # every access node has the same secret
    return str(json.loads(Path(access.config).read_text())["secret"]).encode()


def test_prometheus_scrapes_every_process(cluster: ClusterInfo, tmp_path: Path) -> None:
    """Debian's Prometheus server scrapes the whole cluster and answers a query over what it scraped."""
    targets = [p.url.removeprefix("http://") for p in _scraped(cluster)]
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                                  "scrape_configs": [{"job_name": "blobstore",
                                                      "static_configs": [{"targets": targets}]}]}))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115  (closed below, after the process)
    server = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        def all_up() -> bool:
            try:
                active = httpx.get(f"{api}/targets", timeout=2).json()["data"]["activeTargets"]
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            return len(active) == len(targets) and all(t["health"] == "up" for t in active)

        wait_until(all_up, 40, "Prometheus to scrape every process successfully")
        query = 'count(blobstore_service_info == 1)'
        answer = httpx.get(f"{api}/query", params={"query": query}, timeout=5).json()
        assert answer["status"] == "success"
        assert int(answer["data"]["result"][0]["value"][1]) == len(targets)
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def _queue_repairs(cluster: ClusterInfo, count: int) -> None:
    async def send() -> None:
        mqproxy = next(p.url for p in cluster.processes if p.role == "mqproxy")
        async with MqProxyClient([mqproxy]) as client:
            await client.send_repair([RepairIn(vid=1, bid=10_000_000 + i, bad_indexes=[0], reason="test")
                                      for i in range(count)])

    asyncio.run(send())


def _record_task(cluster: ClusterInfo, record: TaskRecord | None, key: str) -> None:
    """Write (or with None, remove) a task record in clustermgr's kv, as the scheduler keeps them."""
    async def write() -> None:
        async with ClusterClient(cluster.clustermgr_urls) as cm:
            if record is None:
                await cm.kv_delete(key)
            else:
                await cm.kv_set(key, record.model_dump_json())

    asyncio.run(write())


def _drawn(line: str, browser: Any) -> bool:
    return bool(browser.find_element(By.CSS_SELECTOR, line).get_attribute("d"))


def test_dashboard_in_headless_chromium(cluster: ClusterInfo, tmp_path: Path) -> None:
    """What a person sees: every blobnode, a disk marked broken shown as broken, the repair backlog
    growing while tinker is down, PUT/GET drawn as plots. Saves a screenshot in the test's temp dir."""
    blobnodes = [p.name for p in cluster.processes if p.role == "blobnode"]
    with Client(cluster.access_urls) as client:
        deadline = time.monotonic() + 6  # a few scrape intervals of traffic, so the plots have lines
        while time.monotonic() < deadline:
            client.get(client.put(os.urandom(20_000)))
    with headless_chromium(tmp_path / "chromium-profile") as browser:
        browser.get(cluster.dashboard_url)
        # the page re-renders its tables every refresh: an element found just before may be gone when read
        wait = WebDriverWait(browser, 30, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException])

        def blobnode_rows(b: Any) -> dict[str, str] | None:  # read whole within one render (a wait retries)
            rows = {e.get_attribute("data-blobnode"): e.text
                    for e in b.find_elements(By.CSS_SELECTOR, "#blobnodes [data-blobnode]")}
            return rows if len(rows) == len(blobnodes) else None

        shown = wait.until(blobnode_rows)
        assert shown is not None and sorted(shown) == sorted(blobnodes)
        assert all("up" in text and "normal" in text for text in shown.values()), shown
        wait.until(lambda b: b.find_element(By.ID, "health").text == "healthy")
        scrubs = "#blobnodes tr[data-disk-id] .scrub"  # each disk's first pass (of an empty disk) ended at its start
        wait.until(lambda b: len(found := b.find_elements(By.CSS_SELECTOR, scrubs)) == len(blobnodes)
                   and all("last pass" in e.text for e in found))
        for line in ('#rate-chart path[data-line="PUT"]', '#latency-chart path[data-line="PUT p99"]'):
            wait.until(partial(_drawn, line))

        disk = json.loads(CliRunner().invoke(app, ["disk", "list", "--dir", cluster.dir, "--json"]).output)[0]
        # Repairs paused: the disk stays broken on screen (the scheduler would repair it within seconds).
        result = CliRunner().invoke(app, ["task", "switch", "disk_repair", "off", "--dir", cluster.dir])
        assert result.exit_code == 0, result.output
        wait_until(lambda: any(sample(p.url, "blobstore_scheduler_active") == 1 and sample(
            p.url, "blobstore_scheduler_switch", {"type": "disk_repair"}) == 0 for p in _scraped(cluster)
            if p.role == "scheduler"), 30, "the active scheduler to read the switch off")  # a new round began
        result = CliRunner().invoke(app, ["disk", "set", str(disk["disk_id"]), "--status", "broken",
                                          "--dir", cluster.dir])
        assert result.exit_code == 0, result.output
        row = f'#blobnodes tr[data-disk-id="{disk["disk_id"]}"] .status'
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, row).text == "broken")
        wait.until(lambda b: f"disk {disk['disk_id']}" in b.find_element(By.ID, "problem-list").text)
        assert "problem" in browser.find_element(By.ID, "health").text

        backlog = '#backlog [data-pipeline="repair"] .backlog-number'
        tinker = next(p for p in cluster.processes if p.role == "tinker")
        stop([(tinker.pid, tinker.started)])
        # Nothing consumes now. A PUT of the traffic above that missed a shard on the disk now broken may have
        # queued a repair tinker could not finish: count from what the page shows once two scrapes agree.
        seen: list[str] = []

        def settled(b: Any) -> bool:
            seen.append(b.find_element(By.CSS_SELECTOR, backlog).text)
            return len(seen) > 15 and seen[-1].isdigit() and seen[-1] == seen[-16]  # 3 s (poll 0.2 s) apart

        wait.until(settled)
        _queue_repairs(cluster, 5)
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, backlog).text == str(int(seen[-1]) + 5))
        wait.until(lambda b: "tinker does not answer" in b.find_element(By.ID, "problem-list").text)

        now = time.time()
        task = TaskRecord(task_id="dashboard-test", task_type=TaskType.DISK_REPAIR, state=TaskState.PREPARED,
                          disk_id=disk["disk_id"], vid=1, unit_index=0, source_vuid=1, ctime=now - 30, mtime=now,
                          done_bytes=3 << 20, total_bytes=12 << 20, done_shards=3, total_shards=12)
        _record_task(cluster, task, task.key)
        try:
            row = '#tasks tr[data-task="dashboard-test"]'
            wait.until(lambda b: "25 %" in b.find_element(By.CSS_SELECTOR, row).text)
            assert "disk_repair" in browser.find_element(By.CSS_SELECTOR, row).text
            assert browser.find_element(By.ID, "open-tasks").text == "(1 open)"
            browser.save_screenshot(str(tmp_path / "dashboard.png"))
        finally:
            _record_task(cluster, None, task.key)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def test_a_cluster_on_one_machine_is_plaintext_and_says_so(cluster: ClusterInfo,
                                                           launched_clusters: LaunchedClusters) -> None:
    """TLS is for links between hosts (`cluster up --hosts`, deploy bundles): on 127.0.0.1 `up` says it is off."""
    assert cluster.ca is None
    assert all(p.url.startswith(("http://", "redis://", "kafka://")) for p in cluster.processes)
    assert sum("plaintext on 127.0.0.1" in line for line in launched_clusters.said) == 1, launched_clusters.said
