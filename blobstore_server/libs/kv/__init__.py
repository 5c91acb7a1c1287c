"""Embedded RocksDB key-value store."""

from blobstore_server.libs.kv.store import DEFAULT_CF, Batch, KVError, KVStore

__all__ = ["DEFAULT_CF", "Batch", "KVError", "KVStore"]
