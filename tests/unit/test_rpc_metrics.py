"""The shared request metrics: plain counts turned into Prometheus families at scrape time, read back
with prometheus-client's own exposition writer and parser."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from blobstore_server.libs.rpc.asgi import Message, Receive, Scope, Send
from blobstore_server.libs.rpc.metrics import STATS, Exchange, Instrumented, RequestStats


def _scrape(stats: RequestStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(stats)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_counts_buckets_and_in_flight_as_prometheus_reads_them() -> None:
    stats = RequestStats(buckets=(0.01, 0.1))
    for seconds in (0.005, 0.01, 0.05, 3.0):
        stats.record("/blob/{token}", "GET", 200, seconds)
    stats.record("/blob/{token}", "GET", 404, 0.002)
    stats.in_flight = 2
    got = _scrape(stats)
    route = (("method", "GET"), ("route", "/blob/{token}"))
    assert got["blobstore_http_requests_total", (*route, ("status", "200"))] == 4
    assert got["blobstore_http_requests_total", (*route, ("status", "404"))] == 1
    buckets = {le: got["blobstore_http_request_duration_seconds_bucket", tuple(sorted((*route, ("le", le))))]
               for le in ("0.01", "0.1", "+Inf")}
    assert buckets == {"0.01": 3, "0.1": 4, "+Inf": 5}  # cumulative; a value on a bound is in that bucket
    assert got["blobstore_http_request_duration_seconds_count", route] == 5
    assert abs(got["blobstore_http_request_duration_seconds_sum", route] - 3.067) < 1e-9
    assert got["blobstore_http_requests_in_flight", ()] == 2


def test_the_middleware_sees_status_bytes_and_route_and_counts_in_flight() -> None:
    seen: list[Exchange] = []
    in_flight: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        in_flight.append(STATS.in_flight)
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"12345"})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"abc", "more_body": False}

    async def send(_: Message) -> None:
        return None

    before = STATS.in_flight
    asyncio.run(Instrumented(app, "/shard/put", [seen.append])(
        {"type": "http", "method": "PUT", "path": "/shard/put"}, receive, send))
    assert in_flight == [before + 1] and STATS.in_flight == before
    (exchange,) = seen
    assert (exchange.route, exchange.method, exchange.status, exchange.bytes_in, exchange.bytes_out) == (
        "/shard/put", "PUT", 201, 3, 5)
