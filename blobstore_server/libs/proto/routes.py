"""Every internal route of a cluster, gathered from the services' API modules: which capability auth requires of
a path (one path may be served by several services, e.g. `/stat`, always for the same capability)."""

from __future__ import annotations

from blobstore_server.libs.proto import access, allocator, blobnode, clustermgr, mqproxy, scheduler, tinker, worker
from blobstore_server.libs.rpc.routes import Capability, Route

CATALOG: tuple[Route, ...] = (*clustermgr.ROUTES, *blobnode.ROUTES, *allocator.ROUTES, *scheduler.ROUTES,
                              *worker.ROUTES, *mqproxy.ROUTES, *tinker.ROUTES, *access.ROUTES)


def _capabilities(routes: tuple[Route, ...]) -> dict[str, Capability]:
    found: dict[str, Capability] = {}
    for route in routes:
        if found.setdefault(route.path, route.capability) is not route.capability:
            raise ValueError(f"{route.path} is declared with both {found[route.path]} and {route.capability}")
    return found


CAPABILITIES = _capabilities(CATALOG)
STREAMED = frozenset(route.path for route in CATALOG if route.streamed)  # bodies signed by length and CRC
