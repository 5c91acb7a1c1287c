"""S3's listing rules over an ordered range source, with no SQL: prefix, delimiter roll-up, marker, max-keys.

The source answers "entries with key >= lo (and past position `after`), key < hi, in order, at most n". With a
delimiter, an entry whose key rolls up into common prefix P makes the engine emit P once and seek to the first key
past every key starting with P: one probe per distinct prefix, never a scan of P's children. A marker is exclusive;
a marker inside a common prefix P skips all of P (P itself sorts before the marker, so it was already given), as
Ceph RGW does. max-keys counts entries and prefixes together; one item more is looked for to tell IsTruncated.
A source whose every statement is a round trip (a database server) may walk those seeks itself, in one statement.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

E = TypeVar("E")  # an entry: an object, an upload
A = TypeVar("A")  # where a source resumes past an entry: an object's key, an upload's (key, id)

Fetch = Callable[[bytes, A | None, bytes | None, int], Sequence[E]]
# walk(lo, hi, n, cut, delimiter, past): up to n entries, the first with key >= lo, each next the first past the one
# before: past its key, or, when the delimiter is in that key at or after byte `cut`, at or past the key cut before
# the delimiter with `past` (the delimiter's prefix_end) appended: past the common prefix. All keys < hi.
Walk = Callable[[bytes, bytes | None, int, int, bytes, bytes], Sequence[E]]

FIRST_BATCH = 1  # entries fetched where the first may roll up into a common prefix (x4 each batch that did not)


def prefix_end(prefix: bytes) -> bytes | None:
    """The least byte string greater than every string starting with `prefix`; None when there is none."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def common_prefix(key: bytes, prefix: bytes, delimiter: bytes) -> bytes | None:
    """The common prefix `key` rolls up into: up to the first delimiter after `prefix`, delimiter included."""
    if not delimiter or not key.startswith(prefix):
        return None
    at = key.find(delimiter, len(prefix))
    return None if at < 0 else key[:at + len(delimiter)]


@dataclass(frozen=True)
class Source(Generic[E, A]):
    """An ordered range of entries: `fetch(lo, after, hi, n)`, each entry's key and resume position, and maybe a
    `walk` (Walk above) taken for a delimiter listing instead of a fetch per common prefix."""

    fetch: Fetch[A, E]
    key: Callable[[E], bytes]
    position: Callable[[E], A]
    walk: Walk[E] | None = None


@dataclass(frozen=True)
class Query(Generic[A]):
    """What to list. `marker` is the key to start after; `after`, when given, a finer position at the marker's key
    (an upload id marker); a marker inside a common prefix skips that prefix whatever `after` says."""

    prefix: bytes = b""
    delimiter: bytes = b""
    marker: bytes | None = None
    after: A | None = None
    max_items: int = 1000


@dataclass(frozen=True)
class Page(Generic[E]):
    """Entries and common prefixes in key order (both lists sorted); `last` is the last item given."""

    entries: list[E]
    prefixes: list[bytes]
    truncated: bool
    last: E | bytes | None


def list_page(source: Source[E, A], query: Query[A]) -> Page[E]:
    """One page of `query` over `source`."""
    entries: list[E] = []
    prefixes: list[bytes] = []
    last: E | bytes | None = None
    if query.max_items <= 0:
        return Page(entries, prefixes, False, None)
    for item in _items(source, query):
        if len(entries) + len(prefixes) == query.max_items:
            return Page(entries, prefixes, True, last)
        if isinstance(item, _Rolled):
            prefixes.append(item.prefix)
            last = item.prefix
        else:
            entries.append(item)
            last = item
    return Page(entries, prefixes, False, last)


@dataclass(frozen=True)
class _Rolled:
    prefix: bytes


def _start(query: Query[A]) -> tuple[bytes | None, bool]:
    """Where listing begins: the lowest key (None: nothing can follow), and whether past `query.after` only."""
    marker = query.marker
    if marker is None or marker < query.prefix:
        return query.prefix, False
    rolled = common_prefix(marker, query.prefix, query.delimiter)
    if rolled is not None:
        return prefix_end(rolled), False
    if query.after is None:
        return marker + b"\x00", False  # the least key past the marker
    return marker, True


def _items(source: Source[E, A], query: Query[A]) -> Iterator[E | _Rolled]:
    """Every item of the listing in order (the page takes max_items + 1), fetched in batches no larger than what
    the page may still take; past a first common prefix (more are likely) the rest in one walk, if the source has
    one."""
    lo, past_after = _start(query)
    after = query.after if past_after else None
    hi = prefix_end(query.prefix) if query.prefix else None
    wanted = query.max_items + 1
    past = prefix_end(query.delimiter) if query.delimiter else None
    batch = FIRST_BATCH if query.delimiter else wanted  # with a delimiter, the first key may well roll up
    while lo is not None and (hi is None or lo < hi) and wanted > 0:
        rows = source.fetch(lo, after, hi, min(batch, wanted))
        rolled: bytes | None = None
        for row in rows:
            rolled = common_prefix(source.key(row), query.prefix, query.delimiter)
            wanted -= 1
            if rolled is not None:
                yield _Rolled(rolled)
                break
            yield row
        if rolled is not None:
            lo, after, batch = prefix_end(rolled), None, FIRST_BATCH
            if source.walk is not None and past is not None:
                yield from _walked(source.walk, source.key, query, lo, hi, wanted, past)
                return
        elif len(rows) < min(batch, wanted + len(rows)):
            return
        else:
            lo, after, batch = source.key(rows[-1]), source.position(rows[-1]), batch * 4


def _walked(walk: Walk[E], key: Callable[[E], bytes], query: Query[A], lo: bytes | None, hi: bytes | None,
            wanted: int, past: bytes) -> Iterator[E | _Rolled]:
    """The items from `lo` on, by one walk: each row that rolls up is its common prefix (the walk went past the
    prefix's other keys)."""
    if lo is None or (hi is not None and lo >= hi) or wanted <= 0:
        return
    for row in walk(lo, hi, wanted, len(query.prefix), query.delimiter, past):
        rolled = common_prefix(key(row), query.prefix, query.delimiter)
        yield row if rolled is None else _Rolled(rolled)


def continuation_token(marker: bytes) -> str:
    """The opaque ListObjectsV2 token for a page that ended at `marker` (a key or a common prefix): the marker and
    its CRC32, so a token the gateway did not give is told apart (InvalidArgument) instead of listed from."""
    return base64.urlsafe_b64encode(marker + zlib.crc32(marker).to_bytes(4, "big")).decode()


def token_marker(token: str) -> bytes | None:
    """The marker a continuation token stands for; None when it is not one of ours (InvalidArgument)."""
    try:
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    marker, crc = raw[:-4], raw[-4:]
    return marker if len(raw) >= 4 and zlib.crc32(marker).to_bytes(4, "big") == crc else None
