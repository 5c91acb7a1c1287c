"""The S3 listing engine against a brute-force reference: random byte keys, prefixes, delimiters (multi-byte and
not '/'), markers and max-keys, with a source that fetches and one that also walks (as PostgreSQL does); pages
chained through their markers give the whole listing; a delimiter costs one probe per common prefix, not a scan of its
children, or one walk."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from blobstore_server.services.s3.namespace.listing import (
    Page,
    Query,
    Source,
    continuation_token,
    list_page,
    prefix_end,
    token_marker,
)

ALPHABET = [0x00, 0x2B, 0x2F, 0x61, 0x62, 0xC3, 0xA9, 0xFF]  # NUL, '+', '/', 'a', 'b', 'é' in UTF-8, 0xff
DELIMITERS = [b"", b"/", b"a", b"/a", b"ab", "é".encode(), b"\xff", b"\x00"]


def byte_strings(max_size: int) -> st.SearchStrategy[bytes]:
    return st.lists(st.sampled_from(ALPHABET), max_size=max_size).map(bytes)


@dataclass
class SortedKeys:
    """A source over sorted unique keys that counts what it is asked."""

    keys: list[bytes]
    walking: bool = False
    calls: int = 0
    rows: int = 0
    limits: list[int] = field(default_factory=list)

    def fetch(self, lo: bytes, after: bytes | None, hi: bytes | None, limit: int) -> list[bytes]:
        assert limit > 0
        self.calls += 1
        self.limits.append(limit)
        start = bisect.bisect_left(self.keys, lo)
        if after is not None:
            start = max(start, bisect.bisect_right(self.keys, after))
        end = len(self.keys) if hi is None else bisect.bisect_left(self.keys, hi)
        rows = self.keys[start:min(end, start + limit)]
        self.rows += len(rows)
        return rows

    def walk(self, lo: bytes, hi: bytes | None, limit: int, cut: int, delimiter: bytes, past: bytes) -> list[bytes]:
        """listing.Walk by its definition: each next key the first at or past the bound the key before sets."""
        self.calls += 1
        end = len(self.keys) if hi is None else bisect.bisect_left(self.keys, hi)
        rows: list[bytes] = []
        while len(rows) < limit and (at := bisect.bisect_left(self.keys, lo)) < end:
            rows.append(self.keys[at])
            rolled_at = self.keys[at].find(delimiter, cut)
            lo = self.keys[at] + b"\x00" if rolled_at < 0 else self.keys[at][:rolled_at] + past
        self.rows += len(rows)
        return rows

    def source(self) -> Source[bytes, bytes]:
        return Source(self.fetch, key=lambda k: k, position=lambda k: k, walk=self.walk if self.walking else None)


def reference(keys: list[bytes], prefix: bytes, delimiter: bytes, marker: bytes | None) -> list[tuple[str, bytes]]:
    """Every item of the listing by S3's definition: keys past the marker under the prefix, rolled up at the first
    delimiter after the prefix; a common prefix at or before the marker was given already."""
    items: list[tuple[str, bytes]] = []
    for key in sorted(set(keys)):
        if not key.startswith(prefix) or (marker is not None and key <= marker):
            continue
        rest = key[len(prefix):]
        if delimiter and delimiter in rest:
            rolled = key[:len(prefix) + rest.index(delimiter) + len(delimiter)]
            if (marker is None or rolled > marker) and ("prefix", rolled) not in items:
                items.append(("prefix", rolled))
        else:
            items.append(("key", key))
    return items


def as_items(page: Page[bytes]) -> list[tuple[str, bytes]]:
    return sorted([("key", k) for k in page.entries] + [("prefix", p) for p in page.prefixes], key=lambda i: i[1])


@settings(max_examples=1000, deadline=None)
@given(keys=st.lists(byte_strings(6), max_size=40), prefix=byte_strings(2), delimiter=st.sampled_from(DELIMITERS),
       marker=st.none() | byte_strings(5), max_keys=st.integers(0, 12), walking=st.booleans())
@example(keys=[b"foo/", b"foo+1/", b"foo/bar"], prefix=b"", delimiter=b"/", marker=None, max_keys=5, walking=False)
@example(keys=[b"a/a", b"a/c", b"b"], prefix=b"", delimiter=b"/", marker=b"a/b", max_keys=5, walking=True)
@example(keys=[b"\xff/x", b"\xff\xff"], prefix=b"\xff", delimiter=b"/", marker=None, max_keys=5, walking=True)
def test_a_page_is_the_reference_listing_cut_at_max_keys(keys: list[bytes], prefix: bytes, delimiter: bytes,
                                                         marker: bytes | None, max_keys: int, walking: bool) -> None:
    expected = reference(keys, prefix, delimiter, marker)
    page = list_page(SortedKeys(sorted(set(keys)), walking).source(), Query(prefix, delimiter, marker, None,
                                                                            max_keys))
    assert as_items(page) == expected[:max_keys]
    assert page.truncated == (max_keys > 0 and len(expected) > max_keys)
    if page.truncated:
        assert page.last == expected[max_keys - 1][1]


@settings(max_examples=500, deadline=None)
@given(keys=st.lists(byte_strings(6), max_size=40), prefix=byte_strings(2), delimiter=st.sampled_from(DELIMITERS),
       max_keys=st.integers(1, 5), walking=st.booleans())
@example(keys=[b"\xff", b"\xff\x00"], prefix=b"", delimiter=b"\xff", max_keys=2, walking=False)
def test_pages_chained_through_their_markers_list_everything_once(keys: list[bytes], prefix: bytes,
                                                                  delimiter: bytes, max_keys: int,
                                                                  walking: bool) -> None:
    source = SortedKeys(sorted(set(keys)), walking).source()
    seen: list[tuple[str, bytes]] = []
    marker: bytes | None = None
    for _ in range(len(keys) + 2):
        page = list_page(source, Query(prefix, delimiter, marker, None, max_keys))
        seen += as_items(page)
        if not page.truncated:
            break
        assert isinstance(page.last, bytes)
        token = continuation_token(page.last)
        marker = token_marker(token)
    assert not page.truncated
    assert seen == reference(keys, prefix, delimiter, None)


def test_a_delimiter_costs_one_probe_per_common_prefix_not_a_scan_of_its_children() -> None:
    keys = SortedKeys(sorted(b"dir%03d/file%04d" % (d, f) for d in range(100) for f in range(1000)))
    page = list_page(keys.source(), Query(b"", b"/", None, None, 1000))
    assert page.prefixes == [b"dir%03d/" % d for d in range(100)] and not page.truncated
    assert keys.calls == 101 and keys.rows <= 100 * 8  # the last probe finds nothing past dir099/
    walked = SortedKeys(keys.keys, walking=True)
    assert list_page(walked.source(), Query(b"", b"/", None, None, 1000)) == page
    assert walked.calls == 2 and walked.rows == 100  # the first probe, then the walk past dir000/


def test_without_a_delimiter_a_page_is_read_in_one_fetch_of_max_keys_plus_one() -> None:
    keys = SortedKeys([b"k%05d" % i for i in range(5000)])
    page = list_page(keys.source(), Query(b"k0", b"", b"k00100", None, 1000))
    assert page.entries == [b"k%05d" % i for i in range(101, 1101)] and page.truncated
    assert keys.limits == [1001]


def test_prefix_end_is_the_least_string_past_every_string_with_the_prefix() -> None:
    assert prefix_end(b"foo/") == b"foo0"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff\xff") is None
    assert prefix_end(b"") is None


def test_a_token_the_gateway_did_not_give_is_refused() -> None:
    key = b"\x00\xff/+" + "é".encode()
    assert token_marker(continuation_token(key)) == key and token_marker(continuation_token(b"")) == b""
    assert token_marker("not base64!") is None
    assert token_marker("abcd") is None and token_marker("") is None  # base64, but of no marker of ours
    assert token_marker(continuation_token(key)[:-4] + "AAAA") is None
