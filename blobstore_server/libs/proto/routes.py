"""Every internal route of a cluster, gathered from the services' API modules: what the operator's signer signs
for and what tests check every service against (a path served by several services, e.g. `/stat`, always takes
the same capability). A service's own server and client use only their service's table."""

from __future__ import annotations

from blobstore_server.libs.proto import access, allocator, blobnode, clustermgr, mqproxy, scheduler, tinker, worker
from blobstore_server.libs.rpc.routes import RouteTable

CATALOG = RouteTable(*clustermgr.ROUTES, *blobnode.ROUTES, *allocator.ROUTES, *scheduler.ROUTES, *worker.ROUTES,
                     *mqproxy.ROUTES, *tinker.ROUTES, *access.ROUTES)
