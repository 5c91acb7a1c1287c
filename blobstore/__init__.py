"""Python SDK of the blob store: `Client` (blocking) and `AsyncClient`, their records and exceptions.

The clients (and the HTTP stack under them, ~0.1 s to import) load on first use: the servers import this
package's records and errors only, and each of their processes starts that much sooner."""

import typing

from blobstore.errors import (
    BadRequest,
    BlobstoreError,
    Conflict,
    Forbidden,
    NotFound,
    RangeNotSatisfiable,
    Unavailable,
    UploadIncomplete,
)
from blobstore.records import Slice, Stat, UndeleteResult, Upload

if typing.TYPE_CHECKING:
    from blobstore.client import AsyncClient, Client, Progress

__all__ = [
    "AsyncClient",
    "BadRequest",
    "BlobstoreError",
    "Client",
    "Conflict",
    "Forbidden",
    "NotFound",
    "Progress",
    "RangeNotSatisfiable",
    "Slice",
    "Stat",
    "Unavailable",
    "UndeleteResult",
    "Upload",
    "UploadIncomplete",
]


_CLIENTS = ("AsyncClient", "Client", "Progress")


def __getattr__(name: str) -> typing.Any:
    if name in _CLIENTS:
        from blobstore import client

        return getattr(client, name)
    raise AttributeError(f"module 'blobstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_CLIENTS])
