"""Python SDK of the blob store: `Client` (blocking) and `AsyncClient`, their records and exceptions."""

from blobstore.client import AsyncClient, Client, Progress
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
from blobstore.records import Slice, Stat, Upload

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
    "Upload",
    "UploadIncomplete",
]
