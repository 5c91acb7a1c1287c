"""Erasure codec: code modes, stripe encode/decode/reconstruct over ISA-L or zfec."""

from blobstore_server.libs.ec.backends import BACKENDS, DEFAULT_BACKEND
from blobstore_server.libs.ec.codec import Codec, codec_for
from blobstore_server.libs.ec.codemode import ALIGN_2KB, MAX_BLOB_SIZE, CodeMode, Tactic, parse_code_mode, tactic
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

__all__ = [
    "ALIGN_2KB",
    "BACKENDS",
    "DEFAULT_BACKEND",
    "MAX_BLOB_SIZE",
    "BackendMismatch",
    "BlobTooLarge",
    "CodeMode",
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
