"""Access HTTP routes: PUT /blob, POST /blob/alloc + PUT /blob/putat (multipart), GET|HEAD /blob/<location>,
GET /blob/<location>/stat, DELETE, and POST /undelete (signed: services/access/undelete.py). A large GET that
accepts `READ_PLAN_TYPE` may be answered a read plan instead of the bytes. PUT /blob and GET /blob/<location> move
the objects' bytes: they are bare ASGI routes (FastAPI's machinery costs more than the rest of a small GET), the
others FastAPI."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Request, Response

from blobstore.records import (
    READ_PLAN_TYPE,
    AllocRequest,
    AllocResult,
    DeleteResult,
    PutAtResult,
    PutResult,
    Stat,
    UndeleteRequest,
    UndeleteResult,
)
from blobstore_server.libs.ec import CodeMode, UnknownCodeMode, parse_code_mode
from blobstore_server.libs.proto import access as api
from blobstore_server.libs.proto.location import Location
from blobstore_server.libs.rpc.asgi import SPLICE
from blobstore_server.libs.rpc.errors import BadRequest, LengthRequired
from blobstore_server.libs.rpc.metrics import Observer
from blobstore_server.libs.rpc.server import (
    ASGIApp,
    Lifecycle,
    Receive,
    Scope,
    Send,
    body_stream,
    create_app,
    header,
    send_json,
    send_stream,
    serves,
    with_fast_routes,
)
from blobstore_server.services.access.audit import note_location, note_plan
from blobstore_server.services.access.region import Region
from blobstore_server.services.access.stripes import parse_range


def _declared_length(path: str, raw: str | None) -> int:
    if raw is None:
        raise LengthRequired(f"{path} needs a Content-Length header (chunked uploads are not accepted)")
    if not raw.isdigit():
        raise BadRequest(f"Content-Length {raw!r} is not a byte count")
    return int(raw)


def _code_mode(name: str | None) -> CodeMode | None:
    try:
        return None if name is None else parse_code_mode(name)
    except UnknownCodeMode as exc:
        raise BadRequest(str(exc)) from None


def _location_headers(location: Location) -> dict[str, str]:
    return {"accept-ranges": "bytes", "x-object-size": str(location.size), "x-object-crc": str(location.crc),
            "x-code-mode": location.code_mode.name}


def build_app(store: Region, life: Lifecycle, observers: Sequence[Observer] = ()) -> ASGIApp:
    app = create_app("access", on_start=life.start, on_stop=life.stop, observers=observers)

    async def put_blob(scope: Scope, receive: Receive, send: Send) -> None:
        size = _declared_length(scope["path"], header(scope, b"content-length"))
        mode = _code_mode(header(scope, b"x-code-mode"))
        location = note_location(scope, await store.put(body_stream(receive), size, mode))
        await send_json(send, 200, PutResult(location=location.to_token(store.secret), size=location.size,
                                             crc=location.crc, code_mode=location.code_mode.name))

    async def get_blob(scope: Scope, receive: Receive, send: Send) -> None:
        location = note_location(scope, store.parse(scope["path_params"]["token"]))
        wanted = parse_range(header(scope, b"range"), location.size)
        offset, length = (0, location.size) if wanted is None else wanted
        headers = _location_headers(location)
        status = 200
        if wanted is not None:
            status = 206
            headers["content-range"] = f"bytes {offset}-{offset + length - 1}/{location.size}"
        if READ_PLAN_TYPE in (header(scope, b"accept") or ""):
            plan = await store.read_plan(location, offset, length)
            if plan is not None:
                note_plan(scope, plan.size)
                await send_json(send, 200, plan, _location_headers(location), READ_PLAN_TYPE)
                return
        spliced = SPLICE in scope.get("extensions", {})  # the bytes may then stay in the blobnodes' answers
        await send_stream(send, length, store.read(location, offset, length, spliced), headers, status)

    @app.post("/blob/alloc")
    async def alloc_blobs(req: AllocRequest) -> AllocResult:
        location, tokens = await store.alloc(req.size, _code_mode(req.code_mode))
        return AllocResult(location=location.to_token(store.secret), tokens=[t.to_token(store.secret) for t in tokens],
                           blob_size=location.blob_size, expiry=tokens[0].expiry if tokens else 0)

    @app.put("/blob/putat")
    async def put_at(token: str, request: Request) -> PutAtResult:
        size = _declared_length(request.url.path, request.headers.get("content-length"))
        blob = await store.put_at(token, request.stream(), size)
        return PutAtResult(vid=blob.vid, bid=blob.bid, size=blob.size)

    @app.get("/blob/{token}/stat")
    async def stat_blob(token: str, request: Request) -> Stat:
        return note_location(request.scope, store.parse(token)).stat()

    @app.head("/blob/{token}")
    async def head_blob(token: str, request: Request) -> Response:
        location = note_location(request.scope, store.parse(token))
        return Response(headers={**_location_headers(location), "content-length": str(location.size)})

    @app.delete("/blob/{token}", status_code=202)
    async def delete_blob(token: str, request: Request) -> DeleteResult:
        return DeleteResult(queued_blobs=await store.delete(note_location(request.scope, store.parse(token))))

    @serves(app, api.UNDELETE)
    async def undelete_blob(req: UndeleteRequest, request: Request) -> UndeleteResult:
        return await store.undelete(note_location(request.scope, store.parse(req.location)))

    return with_fast_routes(app, {"PUT /blob": put_blob, "GET /blob/{token}": get_blob})
