"""SigV4 verification against requests signed by botocore itself: what boto3 and the aws CLI send must verify, and
any change to what was signed must not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.sigv4 import PayloadMode, Verified, WireRequest, canonical_uri, verify

ACCESS, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ENDPOINT = "http://127.0.0.1:9000"
KEYS = ["plain.txt", "with space.txt", "a+b=c&d.txt", "ünï/cødé 🎉.bin", "tilde~x", "dir/sub/(1)*'!.txt",
        "per%cent", "semi;colon,comma:colon@at$"]
QUERIES = ["uploads", "partNumber=1&uploadId=x", "list-type=2&prefix=a%2Fb", "delete", "versionId=a%2Bb%3D",
           "list-type=2&prefix=&delimiter=%2F&max-keys=10", "response-content-disposition=attachment%3B%20a%20b"]


def _secrets(access: str) -> str | None:
    return {ACCESS: SECRET, "OTHER": "other-secret"}.get(access)


def _wire(request: AWSRequest) -> WireRequest:
    prepared = request.prepare()
    url = urlsplit(prepared.url)
    headers = [(name, value.decode() if isinstance(value, bytes) else value) for name, value in request.headers.items()]
    if not any(name.lower() == "host" for name, _ in headers):
        headers.append(("Host", url.netloc))
    return WireRequest(prepared.method, url.path, url.query, headers)


def _stamp(request: AWSRequest) -> datetime:
    """When botocore signed `request`."""
    return datetime.strptime(request.context["timestamp"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def _signed(method: str = "GET", key: str = "plain.txt", query: str = "", body: bytes = b"",
            headers: dict[str, str] | None = None, secret: str = SECRET) -> tuple[WireRequest, datetime]:
    url = f"{ENDPOINT}/bucket/{quote(key, safe='/~')}" + (f"?{query}" if query else "")
    request = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    S3SigV4Auth(Credentials(ACCESS, secret), "s3", "us-east-1").add_auth(request)
    return _wire(request), _stamp(request)


def _presigned(method: str = "GET", key: str = "plain.txt", query: str = "", expires: int = 3600,
               headers: dict[str, str] | None = None) -> tuple[WireRequest, datetime]:
    url = f"{ENDPOINT}/bucket/{quote(key, safe='/~')}" + (f"?{query}" if query else "")
    request = AWSRequest(method=method, url=url, headers=headers or {})
    S3SigV4QueryAuth(Credentials(ACCESS, SECRET), "s3", "us-east-1", expires=expires).add_auth(request)
    return _wire(request), _stamp(request)


def _refused(code: str, request: WireRequest, now: datetime,
             secrets: Callable[[str], str | None] = _secrets) -> S3Error:
    with pytest.raises(S3Error) as caught:
        verify(request, secrets, now)
    assert caught.value.code == code, caught.value
    return caught.value


def _with_header(request: WireRequest, name: str, value: str) -> WireRequest:
    kept = [(n, v) for n, v in request.headers if n.lower() != name.lower()]
    return replace(request, headers=[*kept, (name, value)])


def _header(request: WireRequest, name: str) -> str:
    return next(v for n, v in request.headers if n.lower() == name.lower())


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("query", ["", *QUERIES])
def test_a_botocore_signed_request_verifies(key: str, query: str) -> None:
    request, when = _signed("GET", key, query)
    verified = verify(request, _secrets, when)
    assert verified.access_key == ACCESS and not verified.anonymous and not verified.presigned
    assert verified.payload is PayloadMode.SHA256 and verified.region == "us-east-1"
    assert verified.signing is not None and verified.signing.seed_signature in _header(request, "authorization")


def test_a_signed_put_carries_its_declared_sha256_and_the_chunk_signing_material() -> None:
    headers = {"x-amz-meta-note": "  two   spaces  ", "Content-Type": "a/b"}
    request, when = _signed("PUT", "k", body=b"hello world", headers=headers)
    verified = verify(request, _secrets, when)
    assert verified.content_sha256 == "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
    assert verified.signing is not None
    assert verified.signing.scope == f"{when:%Y%m%d}/us-east-1/s3/aws4_request"
    assert verified.signing.amz_date == f"{when:%Y%m%dT%H%M%SZ}" and len(verified.signing.key) == 32


@pytest.mark.parametrize("declared", ["UNSIGNED-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                                      "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
                                      "STREAMING-UNSIGNED-PAYLOAD-TRAILER"])
def test_each_payload_mode_is_named(declared: str) -> None:
    # botocore's S3 signer writes its own x-amz-content-sha256: make it write ours, as an SDK streaming would
    request = AWSRequest(method="PUT", url=f"{ENDPOINT}/bucket/k", headers={"X-Amz-Content-SHA256": declared})
    auth = S3SigV4Auth(Credentials(ACCESS, SECRET), "s3", "us-east-1")
    auth.payload = lambda _request: declared  # type: ignore[method-assign]
    auth.add_auth(request)
    when = _stamp(request)
    verified = verify(_wire(request), _secrets, when)
    assert verified.payload is PayloadMode(declared) and verified.content_sha256 is None


def test_repeated_headers_are_joined_with_commas() -> None:
    request = AWSRequest(method="GET", url=f"{ENDPOINT}/bucket/k")
    request.headers.add_header("x-amz-meta-multi", "one")  # type: ignore[attr-defined]
    request.headers.add_header("x-amz-meta-multi", "two")  # type: ignore[attr-defined]
    S3SigV4Auth(Credentials(ACCESS, SECRET), "s3", "us-east-1").add_auth(request)
    when = _stamp(request)
    wire = _wire(request)
    assert [v for n, v in wire.headers if n == "x-amz-meta-multi"] == ["one", "two"]
    assert verify(wire, _secrets, when).access_key == ACCESS


@pytest.mark.parametrize("tamper", [
    lambda r: replace(r, method="DELETE"),
    lambda r: replace(r, path=r.path + "x"),
    lambda r: replace(r, path=r.path.replace("bucket", "other")),
    lambda r: replace(r, query=r.query.replace("uploadId=x", "uploadId=y")),
    lambda r: replace(r, query=r.query + "&versionId=1"),
    lambda r: _with_header(r, "x-amz-meta-note", "changed"),
    lambda r: _with_header(r, "Host", "evil.example:9000"),
    lambda r: _with_header(r, "x-amz-content-sha256", "0" * 64),
    lambda r: replace(r, headers=[(n, v) for n, v in r.headers if n.lower() != "x-amz-meta-note"]),
], ids=["method", "path", "bucket", "query-value", "query-added", "header", "host", "sha256", "header-dropped"])
def test_any_change_to_what_was_signed_fails(tamper: Callable[[WireRequest], WireRequest]) -> None:
    request, when = _signed("PUT", "k", "partNumber=1&uploadId=x", headers={"x-amz-meta-note": "n"})
    _refused("SignatureDoesNotMatch", tamper(request), when)


def test_a_changed_date_or_a_wrong_secret_is_refused() -> None:
    request, when = _signed("GET", "k")
    later = when + timedelta(seconds=1)
    _refused("SignatureDoesNotMatch", _with_header(request, "X-Amz-Date", f"{later:%Y%m%dT%H%M%SZ}"), when)
    other, _ = _signed("GET", "k", secret="not-the-secret")
    _refused("SignatureDoesNotMatch", other, when)


def test_an_unknown_access_key_is_invalid_access_key_id() -> None:
    request, when = _signed("GET", "k")
    _refused("InvalidAccessKeyId", request, when, lambda _access: None)


def test_clock_skew_boundary_is_fifteen_minutes_either_way() -> None:
    request, when = _signed("GET", "k")
    for delta in (timedelta(minutes=15), -timedelta(minutes=15)):
        assert verify(request, _secrets, when + delta).access_key == ACCESS
    for delta in (timedelta(minutes=15, seconds=1), -timedelta(minutes=15, seconds=1)):
        _refused("RequestTimeTooSkewed", request, when + delta)


def test_missing_or_invalid_content_sha256_is_refused() -> None:
    request, when = _signed("GET", "k")
    dropped = replace(request, headers=[(n, v) for n, v in request.headers if n.lower() != "x-amz-content-sha256"])
    _refused("MissingSecurityHeader", dropped, when)
    _refused("InvalidArgument", _with_header(request, "x-amz-content-sha256", "abc"), when)
    _refused("InvalidArgument", _with_header(request, "x-amz-content-sha256", "STREAMING-NOPE"), when)


@pytest.mark.parametrize("authorization,code", [
    ("AWS AKID:abc=", "InvalidRequest"),
    ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20200101/us-east-1/s3/aws4_request", "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AK/{d}/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature={s}",
     "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AK/20000101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature={s}",
     "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AK/{d}/us-east-1/s3/aws4_request, SignedHeaders=x-amz-date, Signature={s}",
     "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AK/{d}/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=xyz",
     "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 Credential=AK/{d}/us-east-1/s3/aws4_request, SignedHeaders=Host, Signature={s}",
     "AuthorizationHeaderMalformed"),
    ("AWS4-HMAC-SHA256 garbage", "AuthorizationHeaderMalformed"),
])
def test_a_malformed_authorization_header_is_refused(authorization: str, code: str) -> None:
    request, when = _signed("GET", "k")
    value = authorization.format(d=f"{when:%Y%m%d}", s="a" * 64)
    _refused(code, _with_header(request, "Authorization", value), when)


def test_no_date_at_all_is_access_denied() -> None:
    request, when = _signed("GET", "k")
    undated = [(n, v) for n, v in request.headers if n.lower() != "x-amz-date"]
    _refused("AccessDenied", replace(request, headers=undated), when)


def test_the_date_header_signs_when_x_amz_date_is_absent() -> None:
    request = AWSRequest(method="GET", url=f"{ENDPOINT}/bucket/k", headers={"Date": "x"})
    S3SigV4Auth(Credentials(ACCESS, SECRET), "s3", "us-east-1").add_auth(request)
    when = _stamp(request)
    wire = _wire(request)
    assert not any(n.lower() == "x-amz-date" for n, _ in wire.headers)
    assert verify(wire, _secrets, when).access_key == ACCESS


def test_no_auth_at_all_is_anonymous_not_an_error() -> None:
    verified = verify(WireRequest("GET", "/bucket/k", "", [("Host", "h")]), _secrets, datetime.now(UTC))
    assert verified == Verified(None, PayloadMode.UNSIGNED, None, None) and verified.anonymous


def test_header_and_query_auth_together_are_refused() -> None:
    request, when = _presigned("GET", "k")
    _refused("InvalidArgument", _with_header(request, "Authorization", "AWS4-HMAC-SHA256 x"), when)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_a_presigned_url_verifies_with_unsigned_payload(key: str, method: str) -> None:
    request, when = _presigned(method, key, "versionId=1" if method == "GET" else "partNumber=2&uploadId=u")
    verified = verify(request, _secrets, when + timedelta(seconds=3599))
    assert verified.access_key == ACCESS and verified.presigned and verified.payload is PayloadMode.UNSIGNED


def test_a_presigned_url_expires_at_its_boundary() -> None:
    request, when = _presigned("GET", "k", expires=60)
    assert verify(request, _secrets, when + timedelta(seconds=60)).access_key == ACCESS
    assert _refused("AccessDenied", request, when + timedelta(seconds=61)).message == "Request has expired"
    _refused("AccessDenied", request, when - timedelta(minutes=16))


@pytest.mark.parametrize("expires", [0, 604801, -1])
def test_presigned_expiry_out_of_range_is_a_query_parameters_error(expires: int) -> None:
    request, when = _presigned("GET", "k")
    query = request.query.replace("X-Amz-Expires=3600", f"X-Amz-Expires={expires}")
    _refused("AuthorizationQueryParametersError", replace(request, query=query), when)


def test_presigned_expiry_of_seven_days_is_allowed() -> None:
    request, when = _presigned("GET", "k", expires=604800)
    assert verify(request, _secrets, when + timedelta(days=7)).presigned


@pytest.mark.parametrize("tamper,code", [
    (lambda q: q.replace("X-Amz-Signature=", "X-Amz-Signature=0"), "AuthorizationQueryParametersError"),
    (lambda q: q.replace("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=AWS4-HMAC-SHA1"),
     "AuthorizationQueryParametersError"),
    (lambda q: "&".join(p for p in q.split("&") if not p.startswith("X-Amz-Date")),
     "AuthorizationQueryParametersError"),
    (lambda q: q.replace("versionId=1", "versionId=2"), "SignatureDoesNotMatch"),
    (lambda q: q + "&acl", "SignatureDoesNotMatch"),
    (lambda q: q.replace("X-Amz-Expires=3600", "X-Amz-Expires=3601"), "SignatureDoesNotMatch"),
    (lambda q: q.replace("AKIDEXAMPLE", "OTHER"), "SignatureDoesNotMatch"),
    (lambda q: q.replace("AKIDEXAMPLE", "NOBODY"), "InvalidAccessKeyId"),
    (lambda q: q + "&X-Amz-Signature=" + "0" * 64, "AuthorizationQueryParametersError"),
], ids=["signature", "algorithm", "no-date", "query-value", "query-added", "expires", "other-key", "unknown-key",
        "repeated"])
def test_a_tampered_presigned_url_is_refused(tamper: Callable[[str], str], code: str) -> None:
    request, when = _presigned("GET", "k", "versionId=1")
    _refused(code, replace(request, query=tamper(request.query)), when)


def test_a_presigned_url_used_with_another_method_or_host_is_refused() -> None:
    request, when = _presigned("PUT", "k")
    _refused("SignatureDoesNotMatch", replace(request, method="GET"), when)
    _refused("SignatureDoesNotMatch", _with_header(request, "Host", "other:1"), when)


def test_canonical_uri_decodes_once_and_never_double_encodes() -> None:
    assert canonical_uri("/b/a%20b%2Bc~d") == "/b/a%20b%2Bc~d"
    assert canonical_uri("/b/a+b") == "/b/a%2Bb"
    assert canonical_uri("/b/%7e%e2%82%ac") == "/b/~%E2%82%AC"
    assert canonical_uri("/b/%2541") == "/b/%2541"
    assert canonical_uri("") == "/"
