"""Dashboard HTTP routes: the page (HTML, script, style) and the overview it draws, as JSON."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Response

from blobstore_server.libs.proto.dashboard import Overview
from blobstore_server.libs.rpc.server import Lifecycle, create_app
from blobstore_server.services.dashboard.watcher import Watcher

STATIC = Path(__file__).resolve().parent / "static"
PAGES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
         "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}


def build_app(watcher: Watcher, life: Lifecycle) -> FastAPI:
    app = create_app("dashboard", on_start=life.start, on_stop=life.stop)

    def page_route(path: str, filename: str, media_type: str) -> None:
        body = (STATIC / filename).read_bytes()

        async def page() -> Response:
            return Response(body, media_type=media_type, headers={"cache-control": "no-cache"})

        app.get(path, include_in_schema=False)(page)

    for path, (filename, media_type) in PAGES.items():
        page_route(path, filename, media_type)

    @app.get("/api/overview")
    async def overview() -> Overview:
        return await watcher.overview()

    return app
