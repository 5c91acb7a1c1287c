"""The access API's signed routes. Access's other routes stay public (the Location or upload token is the
capability); their bodies are the SDK's records (blobstore/records.py), and so are these."""

from __future__ import annotations

from blobstore.records import UndeleteRequest, UndeleteResult
from blobstore_server.libs.rpc.routes import Capability as C
from blobstore_server.libs.rpc.routes import Route, RouteTable

# Routes: each declared once, served by the app, called by the SDK, checked by auth (libs/rpc/routes.py).

UNDELETE = Route("POST", "/undelete", C.UNDELETE, UndeleteResult, UndeleteRequest)
ROUTES = RouteTable(UNDELETE)
