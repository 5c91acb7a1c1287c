"""Access HTTP routes: PUT /blob, POST /blob/alloc + PUT /blob/putat (multipart), GET|HEAD /blob/<location>,
GET /blob/<location>/stat, DELETE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from libs.ec import CodeMode, UnknownCodeMode, parse_code_mode
from libs.proto.access import AllocRequest, AllocResult, DeleteResult, PutAtResult, PutResult, Stat
from libs.proto.location import Location
from libs.rpc.errors import BadRequest, LengthRequired
from libs.rpc.metrics import Observer
from libs.rpc.server import Lifecycle, create_app
from services.access.audit import note_location
from services.access.region import Region
from services.access.stripes import parse_range


def _declared_length(request: Request) -> int:
    raw = request.headers.get("content-length")
    if raw is None:
        raise LengthRequired(f"{request.url.path} needs a Content-Length header (chunked uploads are not accepted)")
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
            "x-code-mode": parse_code_mode(location.code_mode).name}


def build_app(store: Region, life: Lifecycle, observers: Sequence[Observer] = ()) -> FastAPI:
    app = create_app("access", on_start=life.start, on_stop=life.stop, observers=observers)

    @app.put("/blob")
    async def put_blob(request: Request) -> PutResult:
        size = _declared_length(request)
        mode = _code_mode(request.headers.get("x-code-mode"))
        location = note_location(request, await store.put(request.stream(), size, mode))
        return PutResult(location=location.to_token(store.secret), size=location.size, crc=location.crc,
                         code_mode=parse_code_mode(location.code_mode).name)

    @app.post("/blob/alloc")
    async def alloc_blobs(req: AllocRequest) -> AllocResult:
        location, tokens = await store.alloc(req.size, _code_mode(req.code_mode))
        return AllocResult(location=location.to_token(store.secret), tokens=[t.to_token(store.secret) for t in tokens],
                           blob_size=location.blob_size, expiry=tokens[0].expiry if tokens else 0)

    @app.put("/blob/putat")
    async def put_at(token: str, request: Request) -> PutAtResult:
        blob = await store.put_at(token, request.stream(), _declared_length(request))
        return PutAtResult(vid=blob.vid, bid=blob.bid, size=blob.size)

    @app.get("/blob/{token}/stat")
    async def stat_blob(token: str, request: Request) -> Stat:
        return Stat.of(note_location(request, store.parse(token)))

    @app.head("/blob/{token}")
    async def head_blob(token: str, request: Request) -> Response:
        location = note_location(request, store.parse(token))
        return Response(headers={**_location_headers(location), "content-length": str(location.size)})

    @app.get("/blob/{token}")
    async def get_blob(token: str, request: Request) -> Response:
        location = note_location(request, store.parse(token))
        wanted = parse_range(request.headers.get("range"), location.size)
        offset, length = (0, location.size) if wanted is None else wanted
        pieces = store.read(location, offset, length)
        # The first blob is read before the status goes out, so most failures still get a clean 5xx.
        first = await anext(pieces, b"")
        headers = {**_location_headers(location), "content-length": str(length)}
        status = 200
        if wanted is not None:
            status = 206
            headers["content-range"] = f"bytes {offset}-{offset + length - 1}/{location.size}"

        async def body() -> AsyncIterator[bytes]:
            yield first
            async for piece in pieces:
                yield piece

        return StreamingResponse(body(), status_code=status, headers=headers, media_type="application/octet-stream")

    @app.delete("/blob/{token}", status_code=202)
    async def delete_blob(token: str, request: Request) -> DeleteResult:
        return DeleteResult(queued_blobs=await store.delete(note_location(request, store.parse(token))))

    return app
