"""Python SDK of the blob store: `Client` (blocking) and `AsyncClient`, their records and exceptions."""

from blobstore.client import AsyncClient, Client, Progress
from blobstore.errors import BadRequest, BlobstoreError, Forbidden, NotFound, RangeNotSatisfiable, Unavailable
from libs.proto.access import Slice, Stat

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
