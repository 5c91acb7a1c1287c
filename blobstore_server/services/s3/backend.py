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
from blobstore_server.services.s3.namespace import Credentials, Extent, Intent, NamespaceStore
from blobstore_server.services.s3.transfer import Stored

P = ParamSpec("P")
T = TypeVar("T")
CREDENTIALS_TTL = 5.0  # seconds a user's credentials are served from memory: a removed user is refused within it


@dataclass
class Backend:
    store: NamespaceStore
    sdk: AsyncClient
    config: S3Config
    _known: dict[str, tuple[Credentials | None, float]] = field(default_factory=dict)

    async def db(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A store call in a thread (SQLite blocks; each thread has its own connection)."""
        return await asyncio.to_thread(call, *args, **kwargs)

    def credentials(self, access_key: str) -> Credentials | None:
        """Who signs with an access key and its secret, for the signature check (blocks: run it in a thread)."""
        cached = self._known.get(access_key)
        now = time.monotonic()
        if cached is not None and now - cached[1] < CREDENTIALS_TTL:
            return cached[0]
        found = self.store.credentials(access_key)
        if len(self._known) > 10_000:
            self._known.clear()
        self._known[access_key] = (found, now)
        return found

    def stored_into(self, intent: Intent) -> Stored:
        """What a PUT does with each blob it stored: records it in its intent before going on, or holds the body's
        short last one for the commit, which records it in its own transaction."""

        async def stored(extent: Extent, final: bool) -> None:
            if final:
                intent.pending.append(extent.location)
                return
            try:
                await self.db(self.store.add_intent_extent, intent, extent)
            except BaseException:  # not recorded (the namespace failed): the PUT's abandon gives it to GC
                intent.pending.append(extent.location)
                raise

        return stored
