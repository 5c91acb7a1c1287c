"""Signature version 2 presigned URLs as botocore makes them (what `aws s3 presign` and boto3's
generate_presigned_url hand out unless told to use V4): they verify until they expire, and any change to what was
signed does not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import HmacV1QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from blobstore_server.services.s3 import sigv2
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.sigv4 import PayloadMode, WireRequest

ACCESS, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
KEYS = ["plain.txt", "with space.txt", "a+b=c&d.txt", "ünï/cødé 🎉.bin", "tilde~x", "dir/(1)*'!.txt", "per%cent"]
QUERIES = ["", "versionId=null", "response-content-disposition=attachment%3B%20filename%3D%22a%20b%22",
           "uploadId=u1&partNumber=3", "uploads", "list-type=2&prefix=a%2Fb"]


def _secrets(access: str) -> str | None:
    return {ACCESS: SECRET, "OTHER": "other-secret"}.get(access)


def _presigned(method: str = "GET", key: str = "plain.txt", query: str = "", expires: int = 3600,
               headers: dict[str, str] | None = None) -> tuple[WireRequest, datetime]:
    """A V2 presigned URL as botocore makes it, the request that uses it, and the time it expires at."""
    url = f"http://127.0.0.1:9000/bucket/{quote(key, safe='/~')}" + (f"?{query}" if query else "")
    request = AWSRequest(method=method, url=url, headers=headers or {})
    HmacV1QueryAuth(Credentials(ACCESS, SECRET), expires=expires).add_auth(request)
    parts = urlsplit(request.url)
    until = datetime.fromtimestamp(int(dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)["Expires"]),
                                   UTC)
    return WireRequest(method, parts.path, parts.query, [("Host", parts.netloc)]), until


def _refused(code: str, request: WireRequest, now: datetime) -> S3Error:
    with pytest.raises(S3Error) as caught:
        sigv2.verify(request, _secrets, now)
    assert caught.value.code == code, caught.value
    return caught.value


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_a_botocore_presigned_url_verifies(method: str, key: str, query: str) -> None:
    request, until = _presigned(method, key, query)
    assert sigv2.presigned(request.query)
    verified = sigv2.verify(request, _secrets, until - timedelta(seconds=3599))
    assert verified.access_key == ACCESS and verified.presigned and verified.payload is PayloadMode.UNSIGNED


def test_headers_signed_into_the_query_count_as_sent() -> None:
    """botocore moves a presigned PUT's Content-Type and x-amz-* headers into the query string; sent as headers
    too, they must then be the same."""
    request, until = _presigned("PUT", "k", headers={"Content-Type": "text/plain", "x-amz-meta-a": "1"})
    assert "content-type=text%2Fplain" in request.query and sigv2.verify(request, _secrets, until).access_key
    sent = replace(request, headers=[*request.headers, ("Content-Type", "text/plain")])
    assert sigv2.verify(sent, _secrets, until).access_key == ACCESS
    _refused("SignatureDoesNotMatch", replace(request, headers=[*request.headers, ("Content-Type", "image/png")]),
             until)
    _refused("SignatureDoesNotMatch", replace(request, headers=[*request.headers, ("x-amz-meta-b", "2")]), until)


def test_a_presigned_url_expires_at_its_boundary() -> None:
    request, until = _presigned("GET", "k", expires=60)
    assert sigv2.verify(request, _secrets, until).access_key == ACCESS
    assert _refused("AccessDenied", request, until + timedelta(seconds=1)).message == "Request has expired"


@pytest.mark.parametrize("tamper,code", [
    (lambda r: replace(r, path=r.path.replace("/k", "/other")), "SignatureDoesNotMatch"),
    (lambda r: replace(r, method="DELETE"), "SignatureDoesNotMatch"),
    (lambda r: replace(r, query=r.query.replace("versionId=1", "versionId=2")), "SignatureDoesNotMatch"),
    (lambda r: replace(r, query=r.query + "&acl"), "SignatureDoesNotMatch"),
    (lambda r: replace(r, query=r.query.replace("Expires=", "Expires=1")), "SignatureDoesNotMatch"),
    (lambda r: replace(r, query=r.query.replace("Signature=", "Signature=A")), "SignatureDoesNotMatch"),
    (lambda r: replace(r, query=r.query.replace(ACCESS, "OTHER")), "SignatureDoesNotMatch"),
    (lambda r: replace(r, query=r.query.replace(ACCESS, "NOBODY")), "InvalidAccessKeyId"),
    (lambda r: replace(r, query=r.query + "&Signature=x"), "InvalidArgument"),
    (lambda r: replace(r, query="&".join(p for p in r.query.split("&") if not p.startswith("Expires="))),
     "AccessDenied"),
    (lambda r: replace(r, headers=[*r.headers, ("Authorization", "AWS AKIDEXAMPLE:x")]), "InvalidArgument"),
], ids=["path", "method", "subresource-value", "subresource-added", "expires", "signature", "other-key",
        "unknown-key", "repeated", "no-expiry", "with-authorization"])
def test_any_change_to_what_was_signed_is_refused(tamper: Callable[[WireRequest], WireRequest], code: str) -> None:
    request, until = _presigned("GET", "k", "versionId=1")
    _refused(code, tamper(request), until - timedelta(seconds=10))


def test_only_v2_query_auth_is_taken_for_v2() -> None:
    assert not sigv2.presigned("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=abc")
    assert not sigv2.presigned("Signature=abc") and sigv2.presigned("AWSAccessKeyId=a&Expires=1&Signature=s")
