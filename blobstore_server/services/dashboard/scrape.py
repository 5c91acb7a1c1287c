"""Scraped Prometheus text and what the dashboard derives from two scrapes of it, free of I/O.

Rates are counter deltas over the interval between two scrapes of the same process (a counter that
went down means the process restarted: its new value is the delta, as in Prometheus). Latency
quantiles come from the histogram buckets' deltas, interpolated inside the bucket that holds the
quantile like Prometheus's histogram_quantile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from blobstore_server.libs.proto.dashboard import RatePoint

Labels = Mapping[str, str]
PUT_ROUTE = ("/blob", "PUT")
GET_ROUTE = ("/blob/{token}", "GET")
# The samples the dashboard reads. A scrape asks each process for those of its role alone
# (`/metrics?name[]=...`): the whole text of every process every interval cost more to make and parse than
# the rest of an idle cluster's dashboard (bench/idle.py).
REQUESTS = "blobstore_http_requests_total"
LATENCY_BUCKETS = "blobstore_http_request_duration_seconds_bucket"
IN_FLIGHT = "blobstore_http_requests_in_flight"
INSECURE = "blobstore_insecure"
CPU_SECONDS = "process_cpu_seconds_total"
RAFT_ROLE = "blobstore_raft_role"
RAFT_TERM = "blobstore_raft_term"
RAFT_COMMIT = "blobstore_raft_commit_index"
RAFT_APPLIED = "blobstore_raft_applied_index"
VOLUMES = "blobstore_clustermgr_volumes"
SCRUB_PROGRESS = "blobstore_blobnode_scrub_progress"
SCRUB_ENABLED = "blobstore_blobnode_scrub_enabled"
SCRUB_LAST_PASS = "blobstore_blobnode_scrub_last_pass_timestamp_seconds"
SCRUB_CORRUPT = "blobstore_blobnode_scrub_corrupt_total"
SCRUB_REPAIRS_OWED = "blobstore_blobnode_scrub_repairs_owed"
SCRUB_LATE = "blobstore_blobnode_scrub_late_seconds"
PIPELINE_COUNTERS = {field: f"blobstore_tinker_{field}_total" for field in ("messages_in", "done", "failed", "retried")}
SCHEDULER_ACTIVE = "blobstore_scheduler_active"
VOLUMES_AT_MARGIN = "blobstore_scheduler_volumes_at_margin"
_BY_ROLE: dict[str, tuple[str, ...]] = {
    "access": (LATENCY_BUCKETS,),
    "clustermgr": (RAFT_ROLE, RAFT_TERM, RAFT_COMMIT, RAFT_APPLIED, VOLUMES),
    "blobnode": (SCRUB_PROGRESS, SCRUB_ENABLED, SCRUB_LAST_PASS, SCRUB_CORRUPT, SCRUB_REPAIRS_OWED, SCRUB_LATE),
    "tinker": tuple(PIPELINE_COUNTERS.values()),
    "scheduler": (SCHEDULER_ACTIVE, VOLUMES_AT_MARGIN),
}


def wanted(role: str) -> tuple[str, ...]:
    """The sample names the dashboard reads from a process of `role`."""
    return (REQUESTS, IN_FLIGHT, INSECURE, CPU_SECONDS, *_BY_ROLE.get(role, ()))


@dataclass(frozen=True)
class Scrape:
    """One process's samples at one moment: sample name -> [(labels, value)]."""

    time: float
    samples: Mapping[str, Sequence[tuple[Labels, float]]]

    @classmethod
    def parse(cls, text: str, time: float) -> Scrape:
        samples: dict[str, list[tuple[Labels, float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
        return cls(time, samples)

    def matching(self, name: str, **match: str) -> Iterable[tuple[Labels, float]]:
        return ((labels, value) for labels, value in self.samples.get(name, ())
                if all(labels.get(k) == v for k, v in match.items()))

    def total(self, name: str, **match: str) -> float:
        """The sum of every sample of `name` whose labels include `match`."""
        return sum(value for _, value in self.matching(name, **match))

    def value(self, name: str, **match: str) -> float | None:
        """The first sample of `name` whose labels include `match`, None if there is none."""
        return next((value for _, value in self.matching(name, **match)), None)

    def label_where(self, name: str, label: str, value: float) -> str | None:
        """The `label` of the first sample of `name` equal to `value` (e.g. the role gauge that is 1)."""
        return next((labels.get(label) for labels, v in self.matching(name) if v == value), None)

    def buckets(self, name: str, **match: str) -> dict[float, float]:
        """Cumulative histogram bucket counts by upper bound, summed over the matching samples."""
        out: dict[float, float] = {}
        for labels, value in self.matching(name, **match):
            bound = float(labels["le"])
            out[bound] = out.get(bound, 0.0) + value
        return out


def increase(before: float, after: float) -> float:
    """A counter's increase between two reads; a lower second read means it restarted from zero."""
    return after - before if after >= before else after


def rate(before: Scrape, after: Scrape, name: str, **match: str) -> float:
    elapsed = after.time - before.time
    if elapsed <= 0:
        return 0.0
    return increase(before.total(name, **match), after.total(name, **match)) / elapsed


def bucket_increase(before: Scrape, after: Scrape, name: str, **match: str) -> dict[float, float]:
    old = before.buckets(name, **match)
    return {bound: increase(old.get(bound, 0.0), count) for bound, count in after.buckets(name, **match).items()}


def quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """The q-quantile of observations given cumulative bucket counts (upper bound -> count), None when
    there are none; within a bucket the observations are taken as evenly spread."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # beyond the last finite bound: its lower edge is all that is known
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return bounds[-1]


def rate_point(pairs: Sequence[tuple[Scrape, Scrape]]) -> RatePoint:
    """PUT/GET rates and latencies over every access node; `pairs` holds each node's previous and
    latest scrape."""
    per_route: dict[tuple[str, str], tuple[float, dict[float, float]]] = {}
    for route, method in (PUT_ROUTE, GET_ROUTE):
        count = 0.0
        buckets: dict[float, float] = {}
        for before, after in pairs:
            count += rate(before, after, REQUESTS, route=route, method=method)
            for bound, n in bucket_increase(before, after, LATENCY_BUCKETS, route=route, method=method).items():
                buckets[bound] = buckets.get(bound, 0.0) + n
        per_route[(route, method)] = (count, buckets)

    def ms(q: float, buckets: dict[float, float]) -> float | None:
        seconds = quantile(q, buckets)
        return None if seconds is None else round(seconds * 1000, 3)

    (put_rate, put_buckets), (get_rate, get_buckets) = per_route[PUT_ROUTE], per_route[GET_ROUTE]
    latest = max((after.time for _, after in pairs), default=0.0)
    return RatePoint(time=latest, put_per_s=round(put_rate, 3), get_per_s=round(get_rate, 3),
                     put_p50_ms=ms(0.5, put_buckets), put_p99_ms=ms(0.99, put_buckets),
                     get_p50_ms=ms(0.5, get_buckets), get_p99_ms=ms(0.99, get_buckets))
