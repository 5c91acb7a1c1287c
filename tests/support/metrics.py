"""What a service's /metrics says, as a test reads it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from blobstore_server.libs.rpc import client as rpc_client


def sample(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample of `url`'s /metrics (0 when the service has none: not counted yet); an https one
    checked against the CA this process trusts (a launched cluster's)."""
    text = httpx.get(f"{url}/metrics", timeout=5, verify=rpc_client.trusted() or True).text
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in (labels or {}).items()):
                return float(found.value)
    return 0.0
