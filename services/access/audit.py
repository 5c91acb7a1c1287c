"""access's audit log: one JSON line per request, written off the event loop and rotated by size.

The event loop only builds a small dict and puts it on a queue; a logging `QueueListener` thread turns
it into a line and hands it to a `RotatingFileHandler` (path, path.1, ... path.N). A line reads:

    {"time": "2026-11-22T10:00:00.123Z", "method": "GET", "path": "/blob/{token}", "status": 200,
     "bytes_in": 0, "bytes_out": 10240, "latency_ms": 3.2, "client": "127.0.0.1:50312",
     "cluster_id": 1, "vids": [4]}

`path` is the route template: a location token is a capability to read the object, so it is never
written down; the location's cluster and volumes say what was touched (null when the request named
no valid location). Health probes and metric scrapes are not operations on objects: not logged.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from logging.handlers import QueueListener, RotatingFileHandler
from pathlib import Path
from typing import Any

from libs.proto.location import Location
from libs.rpc.asgi import Scope
from libs.rpc.metrics import Exchange

LOCATION_KEY = "blobstore.location"  # where a route leaves the location it served, in the request's scope
UNAUDITED = frozenset({"/health", "/metrics"})  # probes and scrapes, not operations on objects


def note_location(scope: Scope, location: Location) -> Location:
    """Tell the audit log which location this request (its ASGI scope) served."""
    scope[LOCATION_KEY] = location
    return location


def _iso(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1000):03d}Z"


class _Lines(QueueListener):
    """Serializes each entry in the listener's thread, so the event loop never formats JSON."""

    def prepare(self, record: Any) -> logging.LogRecord:
        entry = {**record, "time": _iso(record["time"])}
        return logging.makeLogRecord({"msg": json.dumps(entry, separators=(",", ":"))})


class AuditLog:
    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._queue: queue.SimpleQueue[dict[str, object]] = queue.SimpleQueue()
        handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self._listener = _Lines(self._queue, handler)
        self._listener.start()

    def write(self, exchange: Exchange) -> None:
        """Queue the line for one finished request (called on the event loop: no I/O, no JSON here)."""
        if exchange.route in UNAUDITED:
            return
        location: Location | None = exchange.scope.get(LOCATION_KEY)
        client = exchange.scope.get("client")
        self._queue.put({
            "time": exchange.started, "method": exchange.method, "path": exchange.route, "status": exchange.status,
            "bytes_in": exchange.bytes_in, "bytes_out": exchange.bytes_out,
            "latency_ms": round(exchange.seconds * 1000, 3),
            "client": f"{client[0]}:{client[1]}" if client else None,
            "cluster_id": location.cluster_id if location else None,
            "vids": sorted({s.vid for s in location.blobs}) if location else None,
        })

    def close(self) -> None:
        """Write out what is queued, then stop the writer thread."""
        self._listener.stop()
        for handler in self._listener.handlers:
            handler.close()
