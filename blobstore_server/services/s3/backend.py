"""What every S3 operation works with: the namespace store (blocking SQL, run in threads), the project's SDK
for object bytes, and the gateway's config."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from blobstore import AsyncClient
from blobstore_server.services.s3.config import S3Config
from blobstore_server.services.s3.namespace import Extent, Intent, NamespaceStore
from blobstore_server.services.s3.transfer import Stored

P = ParamSpec("P")
T = TypeVar("T")
SECRET_TTL = 5.0  # seconds a user's secret is served from memory: a removed user is refused within it


@dataclass
class Backend:
    store: NamespaceStore
    sdk: AsyncClient
    config: S3Config
    _secrets: dict[str, tuple[str | None, float]] = field(default_factory=dict)

    async def db(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A store call in a thread (SQLite blocks; each thread has its own connection)."""
        return await asyncio.to_thread(call, *args, **kwargs)

    def secret_for(self, access_key: str) -> str | None:
        """The secret of an access key, for the signature check (runs in its thread)."""
        cached = self._secrets.get(access_key)
        now = time.monotonic()
        if cached is not None and now - cached[1] < SECRET_TTL:
            return cached[0]
        secret = self.store.secret_for(access_key)
        if len(self._secrets) > 10_000:
            self._secrets.clear()
        self._secrets[access_key] = (secret, now)
        return secret

    def stored_into(self, intent: Intent) -> Stored:
        """What a PUT does with each blob it stored: records it in its intent before going on, or holds the body's
        short last one for the commit, which records it in its own transaction."""

        async def stored(extent: Extent, final: bool) -> None:
            if final:
                intent.pending.append(extent.location)
            else:
                await self.db(self.store.add_intent_extent, intent, extent)

        return stored
