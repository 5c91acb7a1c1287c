"""Signature version 2 presigned URLs (`?AWSAccessKeyId=&Expires=&Signature=`): the aws CLI v1's `aws s3 presign`
and boto3's `generate_presigned_url` still sign with it unless configured for V4. Requests signed with a V2
Authorization header are not taken: every SDK signs those with V4.

Pure, as sigv4 is: the signature is the base64 HMAC-SHA1 of the method, Content-MD5, Content-Type, Expires, the
x-amz-* headers and the resource (the path as sent, and the subresources below). A header the signer put in the
query string instead (botocore does, for x-amz-*, Content-Type and Content-MD5) counts as sent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Sequence
from datetime import datetime

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.sigv4 import PayloadMode, Verified, WireRequest, header_map, parse_query

QUERY_AUTH = ("AWSAccessKeyId", "Expires", "Signature")
# query parameters that are part of the signed resource (S3's list, as botocore's HmacV1Auth signs them)
SUBRESOURCES = frozenset({
    "accelerate", "acl", "analytics", "cors", "defaultObjectAcl", "delete", "inventory", "lifecycle", "location",
    "logging", "metrics", "notification", "object-lock", "partNumber", "policy", "replication", "requestPayment",
    "response-cache-control", "response-content-disposition", "response-content-encoding",
    "response-content-language", "response-content-type", "response-expires", "restore", "select", "select-type",
    "storageClass", "tagging", "torrent", "uploadId", "uploads", "versionId", "versioning", "versions", "website",
})


def _pairs(query: str) -> list[tuple[str, str | None]]:
    """The query's (name, value) pairs decoded once; value None for a bare `name` (no '='), which signs as such."""
    raw = [part for part in query.split("&") if part]
    return [(name, value if "=" in part else None) for part, (name, value) in zip(raw, parse_query(query), strict=True)]


def presigned(query: str) -> bool:
    """Whether a request's raw query carries a V2 presigned signature."""
    names = {name for name, _ in _pairs(query)}
    return "AWSAccessKeyId" in names and "Signature" in names


def string_to_sign(method: str, raw_path: str, pairs: Sequence[tuple[str, str | None]],
                   headers: dict[str, list[str]], expires: str) -> str:
    """What a V2 presigned URL's signature covers."""
    given = {name.lower(): value or "" for name, value in pairs
             if name.lower().startswith("x-amz-") or name.lower() in ("content-md5", "content-type")}
    for name, values in headers.items():
        if name.startswith("x-amz-") or name in ("content-md5", "content-type"):
            given[name] = ",".join(value.strip() for value in values)
    amz = "".join(f"{name}:{given[name]}\n" for name in sorted(given) if name.startswith("x-amz-"))
    signed = sorted(((name, value) for name, value in pairs if name in SUBRESOURCES), key=lambda pair: pair[0])
    resource = raw_path.split("?", 1)[0] or "/"
    if signed:
        resource += "?" + "&".join(name if value is None else f"{name}={value}" for name, value in signed)
    return "\n".join((method.upper(), given.get("content-md5", ""), given.get("content-type", ""), expires,
                      amz + resource))


def signature(secret: str, text: str) -> str:
    return base64.b64encode(hmac.new(secret.encode(), text.encode("utf-8", "surrogateescape"),
                                     hashlib.sha1).digest()).decode()


def verify(request: WireRequest, secret_for: Callable[[str], str | None], now: datetime) -> Verified:
    """Who signed a V2 presigned `request`, or S3Error (403/400) saying why not. Its body is unsigned."""
    pairs = _pairs(request.query)
    params = {name: value or "" for name, value in pairs}
    if any(sum(name == wanted for name, _ in pairs) > 1 for wanted in QUERY_AUTH):
        raise S3Error("InvalidArgument", "A query-string authentication parameter is repeated")
    headers = header_map(request.headers)
    if "authorization" in headers:
        raise S3Error("InvalidArgument", "Only one auth mechanism allowed; only the Signature query string "
                                         "parameter or the Authorization header should be specified")
    expires = params.get("Expires", "")
    if not expires.isdigit():
        raise S3Error("AccessDenied", "Query-string authentication requires the Signature, Expires and "
                                      "AWSAccessKeyId parameters")
    if now.timestamp() > int(expires):
        raise S3Error("AccessDenied", "Request has expired")
    access_key = params["AWSAccessKeyId"]
    secret = secret_for(access_key)
    if secret is None:
        raise S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    expected = signature(secret, string_to_sign(request.method, request.path, pairs, headers, expires))
    if not hmac.compare_digest(expected.encode(), params["Signature"].encode("utf-8", "surrogateescape")):
        raise S3Error("SignatureDoesNotMatch", "The request signature we calculated does not match the signature "
                                               "you provided. Check your key and signing method.")
    return Verified(access_key, PayloadMode.UNSIGNED, None, None, presigned=True)
