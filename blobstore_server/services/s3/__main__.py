"""`python -m blobstore_server.services.s3 -c s3.json`"""

from __future__ import annotations

from blobstore import AsyncClient
from blobstore_server.libs.rpc.routes import NO_ROUTES
from blobstore_server.libs.rpc.server import ASGIApp, Lifecycle, run_service
from blobstore_server.services.s3.app import build_app
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.config import S3Config
from blobstore_server.services.s3.namespace import open_namespace
from blobstore_server.services.s3.reaper import reap_forever


def build(config: S3Config) -> tuple[ASGIApp, str]:
    store = open_namespace(config.namespace, gc_delay_ms=int(config.gc_delay * 1000))
    for user in config.service_users:
        store.ensure_user(user.name, user.access_key, user.secret_key, user.buckets)
    backend = Backend(store, AsyncClient(config.access_hosts, ca=config.tls.ca_file if config.tls else None), config)
    life = Lifecycle()

    async def close_store() -> None:
        store.close()

    life.loop(lambda: reap_forever(store, backend.sdk, config.reap_interval, int(config.intent_ttl * 1000)))
    life.close(backend.sdk.aclose, close_store)
    return build_app(backend, life), config.bind_addr


if __name__ == "__main__":
    # S3 clients sign with SigV4, checked by the app itself; `auth` here signs what the gateway sends
    run_service("s3", S3Config, build, routes=NO_ROUTES, public=True)
