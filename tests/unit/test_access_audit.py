"""access's audit log writer: lines land from its own thread, in order, rotated by size."""

from __future__ import annotations

import json
import logging.config
import time
from pathlib import Path

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto.location import Location, SliceInfo
from blobstore_server.libs.rpc.metrics import Exchange
from blobstore_server.services.access.audit import LOCATION_KEY, AuditLog


class Route:
    path = "/blob/{token}"


def _exchange(i: int, location: Location | None) -> Exchange:
    scope: dict[str, object] = {"method": "GET", "route": Route(), "client": ("127.0.0.1", 40000 + i)}
    if location is not None:
        scope[LOCATION_KEY] = location
    return Exchange(scope, started=1_700_000_000.25 + i, seconds=0.0042, status=200, bytes_out=i)


def test_lines_rotate_by_size_and_none_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, max_bytes=4096, backups=3)
    location = Location(cluster_id=7, code_mode=CodeMode.EC15P12, size=6 << 20, blob_size=4 << 20, crc=0,
                        blobs=(SliceInfo(min_bid=1, vid=9, count=1), SliceInfo(min_bid=5, vid=3, count=1)))
    count = 50  # ~210 bytes a line: ~3 files' worth, so it rotates twice but drops nothing
    started = time.perf_counter()
    for i in range(count):
        audit.write(_exchange(i, location if i % 2 else None))
    queued_in = time.perf_counter() - started
    audit.close()
    files = [tmp_path / name for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl")]
    assert all(f.exists() and f.stat().st_size <= 4096 for f in files)
    assert not (tmp_path / "audit.jsonl.3").exists()
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert [line["bytes_out"] for line in lines] == list(range(count))  # oldest file first, in order
    assert lines[1] == {"time": "2023-11-14T22:13:21.250Z", "method": "GET", "path": "/blob/{token}", "status": 200,
                        "bytes_in": 0, "bytes_out": 1, "bytes_planned": 0, "latency_ms": 4.2,
                        "client": "127.0.0.1:40001", "cluster_id": 7, "vids": [3, 9]}
    assert lines[0]["vids"] is None and lines[0]["cluster_id"] is None
    assert queued_in < 0.05  # the caller only queues: no file I/O or JSON on its thread


def test_probes_and_scrapes_are_not_audited(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, backups=1)
    for path in ("/health", "/metrics"):
        audit.write(Exchange({"method": "GET", "route": type("R", (), {"path": path})()}, started=0.0))
    audit.close()
    assert (tmp_path / "audit.jsonl").read_text() == ""


def test_logging_reconfigured_after_start_does_not_stop_the_log(tmp_path: Path) -> None:
    """uvicorn configures logging after the app is built, which closes every handler logging knows of."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, max_bytes=1 << 20, backups=1)
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    audit.write(_exchange(1, None))
    audit.close()
    assert [json.loads(line)["bytes_out"] for line in path.read_text().splitlines()] == [1]
