"""Prometheus metrics every service shares, and the way a service adds its own.

`Instrumented` wraps an ASGI app: it times each HTTP request and notes its status and body bytes,
counts it in `blobstore_http_*` by route template (`/blob/{token}`, never the raw path, so the label
set stays bounded), method and status, and hands the finished `Exchange` to the service's observers
(access's byte counters and audit log). `create_app` puts it around the FastAPI app and
`with_fast_routes` around each bare-ASGI data-path route (the lean protocol records its routes in `STATS` the
same way), so every service gets request counts,
latency histograms and in-flight requests, and serves them on `/metrics` (create_app's route).

A service adds its own figures where its logic lives: a module-level Counter or Histogram for events
as they happen, and for values it already keeps (queue counters, Raft indexes, disk space) a function
read only at scrape time, registered with `register_collector`, which costs the hot path nothing.
The scheduler (issue 11) adds tasks by type and state and repair bytes/s the same way.

`BLOBSTORE_METRICS=off` in a process's environment turns the request instrumentation off, so its cost
can be measured (bench/metrics_cost.py); `/metrics` still answers with the service's own figures.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import REGISTRY, Gauge, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from blobstore_server.libs.rpc.asgi import SPLICE_MESSAGE, ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

disable_created_metrics()  # a `_created` twin of every counter doubles each scrape for nothing we plot
ENABLED = os.environ.get("BLOBSTORE_METRICS", "on").strip().lower() not in ("off", "0", "false", "no")
UNMATCHED = "unmatched"  # the route label of a request no route took (a 404): raw paths never become labels

# Shard calls take ~0.1-5 ms, control-plane calls up to seconds, big objects tens of seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

SERVICE = Gauge("blobstore_service_info", "Always 1; names the service that answers this scrape", ["service"])
# 1 when the process runs without auth on purpose (`insecure: true`), so a scraper (the dashboard) can say so
INSECURE = Gauge("blobstore_insecure", "1: every route of this process is open and nothing it sends is signed")


@dataclass(slots=True)
class Exchange:
    """One HTTP request and its answer, as the instrumentation saw them."""

    scope: Scope
    started: float  # time.time() at arrival
    seconds: float = 0.0
    status: int = 500  # what an app that raised without answering amounts to
    bytes_in: int = 0  # counted only when the service has observers
    bytes_out: int = 0
    fixed_route: str | None = None

    @property
    def method(self) -> str:
        return str(self.scope.get("method", ""))

    @property
    def route(self) -> str:
        """The route template that served the request (Starlette's router notes it in the scope)."""
        if self.fixed_route is not None:
            return self.fixed_route
        route = self.scope.get("route")
        return str(getattr(route, "path", UNMATCHED)) if route is not None else UNMATCHED


Observer = Callable[[Exchange], None]


class RequestStats:
    """Request counts, latency buckets and requests in flight, kept as plain numbers and turned into
    metric families only when scraped. Updated and read on the event loop only, so no lock is needed;
    prometheus-client's own Counter/Histogram/Gauge take a lock per update (~6 us a request here)."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(buckets)
        self.in_flight = 0
        self.counts: dict[tuple[str, str, int], int] = {}
        self.latency: dict[tuple[str, str], list[float]] = {}  # per bucket (last: +Inf), then the sum

    def record(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        self.counts[key] = self.counts.get(key, 0) + 1
        row = self.latency.get(key[:2])
        if row is None:
            row = self.latency[key[:2]] = [0.0] * (len(self.bounds) + 2)
        row[bisect.bisect_left(self.bounds, seconds)] += 1
        row[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        yield counter("blobstore_http_requests", "HTTP requests answered, by route template, method and status",
                      [((route, method, str(status)), n) for (route, method, status), n in self.counts.items()],
                      ["route", "method", "status"])
        latency = HistogramMetricFamily("blobstore_http_request_duration_seconds",
                                        "Time from a request's arrival to the end of its answer, by route "
                                        "template and method", labels=["route", "method"])
        edges = [*(floatToGoString(b) for b in self.bounds), "+Inf"]
        for (route, method), row in self.latency.items():
            latency.add_metric([route, method], list(zip(edges, itertools.accumulate(row[:-1]), strict=True)),
                               row[-1])
        yield latency
        yield gauge("blobstore_http_requests_in_flight", "HTTP requests being served now", self.in_flight)


STATS = RequestStats()


class Instrumented:
    """ASGI middleware measuring each HTTP request; `route` fixes the label for a bare-ASGI route."""

    def __init__(self, app: ASGIApp, route: str | None = None, observers: Sequence[Observer] = ()) -> None:
        self.app = app
        self.route = route
        self.observers = tuple(observers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(scope, time.time(), fixed_route=self.route)

        async def counting_receive() -> Message:
            message = await receive()
            exchange.bytes_in += len(message.get("body", b""))
            return message

        async def observing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body":
                exchange.bytes_out += len(message.get("body", b""))
            elif message["type"] == SPLICE_MESSAGE:
                exchange.bytes_out += len(message["span"])
            await send(message)

        STATS.in_flight += 1
        start = time.perf_counter()
        try:
            await self.app(scope, counting_receive if self.observers else receive, observing_send)
        finally:
            exchange.seconds = time.perf_counter() - start
            STATS.in_flight -= 1
            if ENABLED:
                STATS.record(exchange.route, exchange.method, exchange.status, exchange.seconds)
            for observe in self.observers:
                observe(exchange)


def measuring(observers: Sequence[Observer]) -> bool:
    """Whether requests are measured at all: metrics are on, or something observes them."""
    return ENABLED or bool(observers)


def instrument(app: ASGIApp, route: str | None = None, observers: Sequence[Observer] = ()) -> ASGIApp:
    """`app` measured (see `Instrumented`), or `app` itself when nothing would use the measurement."""
    return Instrumented(app, route, observers) if measuring(observers) else app


# A service's own figures, read at scrape time.

Row = tuple[Sequence[str], float]  # label values, value


def gauge(name: str, doc: str, rows: Iterable[Row] | float, labels: Sequence[str] = ()) -> Metric:
    """A gauge family: one value, or one row per label-value combination."""
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in _rows(rows):
        family.add_metric(list(values), value)
    return family


def counter(name: str, doc: str, rows: Iterable[Row] | float, labels: Sequence[str] = ()) -> Metric:
    """A counter family (`name` without `_total`) from totals a service already keeps."""
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in _rows(rows):
        family.add_metric(list(values), value)
    return family


def _rows(rows: Iterable[Row] | float) -> Iterable[Row]:
    return [((), float(rows))] if isinstance(rows, int | float) else rows


class _Callback:
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def describe(self) -> list[Metric]:
        return []  # nothing read at registration: the service may not be started yet

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self._collect())
        except Exception:  # one broken figure must not take the request metrics down with it
            log.exception("collecting %s failed", getattr(self._collect, "__qualname__", self._collect))
            return []


def register_collector(collect: Callable[[], Iterable[Metric]]) -> None:
    """Have `collect` yield a service's figures at every scrape of `/metrics`."""
    REGISTRY.register(_Callback(collect))


register_collector(STATS.collect)


@dataclass(frozen=True)
class Only:
    """The registry's samples named in `names` alone (for `/metrics?name[]=...`). Filtered here rather than by
    prometheus_client's restricted registry, which leaves out collectors that cannot name their samples
    before they run, as `register_collector`'s cannot."""

    names: frozenset[str]

    def collect(self) -> Iterator[Metric]:
        for metric in REGISTRY.collect():
            samples = [sample for sample in metric.samples if sample.name in self.names]
            if samples:
                kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                kept.samples = samples
                yield kept
