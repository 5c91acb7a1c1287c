"""Python SDK of the blob store: `Client` (blocking) and `AsyncClient`, their records and exceptions."""

from blobstore.client import AsyncClient, Client, Progress, Slice, Stat
from blobstore.errors import BadRequest, BlobstoreError, Forbidden, NotFound, RangeNotSatisfiable, Unavailable

__all__ = [
    "AsyncClient",
    "BadRequest",
    "BlobstoreError",
    "Client",
    "Forbidden",
    "NotFound",
    "Progress",
    "RangeNotSatisfiable",
    "Slice",
    "Stat",
    "Unavailable",
]
