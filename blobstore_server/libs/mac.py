"""HMAC-SHA256 for the request path, without giving up the GIL.

`hmac.digest` releases the GIL around OpenSSL's one-shot HMAC even for a few bytes, and taking it back in a
process whose other threads are busy (a blobnode's disk threads, access's codec threads) waits for the
interpreter's switch interval: 5.2 ms per call against 6 us measured on this project's machine with one busy
thread. A keyed HMAC object copied per message keeps the GIL for messages under hashlib's 2 KiB threshold, and
does not key OpenSSL again each time."""

from __future__ import annotations

import functools
import hashlib
import hmac


@functools.lru_cache(maxsize=4096)  # capability, identity and grant keys: a few per process
def _keyed(key: bytes) -> hmac.HMAC:
    return hmac.new(key, digestmod=hashlib.sha256)


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    mac = _keyed(key).copy()
    mac.update(message)
    return mac.digest()
