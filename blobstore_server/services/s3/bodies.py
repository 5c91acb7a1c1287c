"""The XML bodies clients send (CompleteMultipartUpload, Delete, CreateBucketConfiguration), parsed with
defusedxml (no entity expansion, no external fetches) into plain values; anything malformed is MalformedXML."""

from __future__ import annotations

from xml.etree.ElementTree import Element

import defusedxml.ElementTree as SafeXml
from defusedxml import DefusedXmlException

from blobstore_server.services.s3.errors import S3Error

MAX_BODY = 2 << 20  # 10,000 parts or 1,000 keys of 1 KiB each stay well under it
MAX_DELETE_KEYS = 1000


def _local(tag: str) -> str:
    """A tag without its namespace: clients send S3's 2006-03-01 namespace, or none."""
    return tag.rsplit("}", 1)[-1]


def _root(body: bytes, expected: str) -> Element:
    if len(body) > MAX_BODY:
        raise S3Error("MalformedXML", f"the XML body is over {MAX_BODY} bytes")
    try:
        root = SafeXml.fromstring(body)
    except (SafeXml.ParseError, DefusedXmlException) as exc:
        raise S3Error("MalformedXML", f"the XML body does not parse: {exc}") from None
    if _local(root.tag) != expected:
        raise S3Error("MalformedXML", f"the XML body is a {_local(root.tag)}, not a {expected}")
    return root


def _children(parent: Element, name: str) -> list[Element]:
    return [child for child in parent if _local(child.tag) == name]


def _text(parent: Element, name: str) -> str | None:
    found = _children(parent, name)
    return None if not found else found[0].text or ""


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """CompleteMultipartUpload: (part number, ETag as sent) in the client's order (the caller checks it)."""
    parts = []
    for part in _children(_root(body, "CompleteMultipartUpload"), "Part"):
        number, etag = _text(part, "PartNumber"), _text(part, "ETag")
        if number is None or etag is None or not number.strip().isdigit():
            raise S3Error("MalformedXML", "each Part needs a PartNumber and an ETag")
        parts.append((int(number), etag.strip()))
    if not parts:
        raise S3Error("MalformedXML", "a CompleteMultipartUpload must name at least one part")
    return parts


def parse_delete(body: bytes) -> tuple[list[bytes], bool]:
    """Delete (DeleteObjects): the keys, and whether the answer is quiet (errors only)."""
    root = _root(body, "Delete")
    keys = []
    for obj in _children(root, "Object"):
        key = _text(obj, "Key")
        if not key:
            raise S3Error("MalformedXML", "each Object needs a Key")
        version = _text(obj, "VersionId")
        if version not in (None, "null"):
            raise S3Error("NotImplemented", "versioned deletes are not supported (buckets are unversioned)")
        keys.append(key.encode())
    if not keys or len(keys) > MAX_DELETE_KEYS:
        raise S3Error("MalformedXML", f"a Delete names 1 to {MAX_DELETE_KEYS} objects, not {len(keys)}")
    return keys, (_text(root, "Quiet") or "").strip().lower() == "true"


def parse_create_bucket(body: bytes) -> str:
    """CreateBucketConfiguration's LocationConstraint ("" when the body is empty or names none)."""
    if not body.strip():
        return ""
    return (_text(_root(body, "CreateBucketConfiguration"), "LocationConstraint") or "").strip()
