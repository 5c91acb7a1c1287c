"""Erasure codec: code modes, stripe encode/decode/reconstruct over ISA-L or zfec.

`Codec` and `codec_for` load on first use: they bring numpy and the codec libraries (~0.1 s of CPU per process),
which the control plane, using code modes only, never needs."""

from typing import TYPE_CHECKING, Any

from blobstore_server.libs.ec.backends import BACKENDS, DEFAULT_BACKEND
from blobstore_server.libs.ec.codemode import (
    ALIGN_2KB,
    MAX_BLOB_SIZE,
    CodeMode,
    CodeModeName,
    Tactic,
    parse_code_mode,
    tactic,
)
from blobstore_server.libs.ec.errors import (
    BackendMismatch,
    BlobTooLarge,
    ECError,
    NotEnoughShards,
    ShardCountMismatch,
    ShardSizeMismatch,
    UnknownBackend,
    UnknownCodeMode,
)

if TYPE_CHECKING:
    from blobstore_server.libs.ec.codec import Codec, codec_for

__all__ = [
    "ALIGN_2KB",
    "BACKENDS",
    "DEFAULT_BACKEND",
    "MAX_BLOB_SIZE",
    "BackendMismatch",
    "BlobTooLarge",
    "CodeMode",
    "CodeModeName",
    "Codec",
    "ECError",
    "NotEnoughShards",
    "ShardCountMismatch",
    "ShardSizeMismatch",
    "Tactic",
    "UnknownBackend",
    "UnknownCodeMode",
    "codec_for",
    "parse_code_mode",
    "tactic",
]


def __getattr__(name: str) -> Any:
    if name in ("Codec", "codec_for"):
        from blobstore_server.libs.ec import codec

        return getattr(codec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
