"""AWS Signature Version 4 verification for S3 requests: header auth and presigned URLs.

Pure (no I/O): the HTTP layer hands over the request as received and a lookup of secrets, and gets back who signed
it and how the body is to be read (`PayloadMode`); the body itself is checked later, by `chunked` (aws-chunked
frames and their signatures) and `checksums` (a declared SHA-256). The canonical form follows what S3 itself
computes, not botocore's shortcuts: the path and query are decoded once and re-encoded, never double-encoded.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from enum import Enum
from urllib.parse import quote, unquote_to_bytes

from blobstore_server.services.s3.errors import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = timedelta(minutes=15)
MAX_EXPIRES = 604800  # seconds: a presigned URL lives at most 7 days
AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_QUERY_AUTH = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
               "X-Amz-Signature")


class PayloadMode(Enum):
    """How the body is protected, from x-amz-content-sha256 (its wire value, or "sha256" for a hex digest)."""

    SHA256 = "sha256"
    UNSIGNED = "UNSIGNED-PAYLOAD"
    STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
    STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"

    @property
    def streaming(self) -> bool:
        """The body is aws-chunked framed (Content-Encoding: aws-chunked)."""
        return self.value.startswith("STREAMING-")

    @property
    def chunks_signed(self) -> bool:
        return self in (PayloadMode.STREAMING_SIGNED, PayloadMode.STREAMING_SIGNED_TRAILER)


@dataclass(frozen=True)
class WireRequest:
    """A request as received: raw (percent-encoded) path and query, headers in order, repeats allowed."""

    method: str
    path: str
    query: str
    headers: Sequence[tuple[str, str]]


@dataclass(frozen=True)
class ChunkSigning:
    """What verifying aws-chunked signatures needs: the chain starts at the request's own signature."""

    key: bytes
    seed_signature: str
    amz_date: str
    scope: str


@dataclass(frozen=True)
class Verified:
    """The outcome of `verify`. `access_key` None means no auth at all: the caller decides what anonymous may do."""

    access_key: str | None
    payload: PayloadMode
    content_sha256: str | None  # the declared lowercase hex digest, when PayloadMode.SHA256
    signing: ChunkSigning | None  # None when anonymous
    region: str = ""
    presigned: bool = False

    @property
    def anonymous(self) -> bool:
        return self.access_key is None


@dataclass(frozen=True)
class _Claim:
    """The parts of an Authorization header or a presigned query, parsed but not yet checked."""

    access_key: str
    date: str  # yyyymmdd from the credential
    region: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str
    when: datetime

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/s3/aws4_request"


class _KeyCache:
    """Derived signing keys per (secret, date, region): four HMACs saved per request, a bounded dict."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._keys: dict[tuple[str, str, str], bytes] = {}

    def get(self, secret: str, date: str, region: str) -> bytes:
        found = self._keys.get((secret, date, region))
        if found is None:
            found = signing_key(secret, date, region)
            if len(self._keys) >= self._size:
                self._keys.pop(next(iter(self._keys)))
            self._keys[(secret, date, region)] = found
        return found


_KEYS = _KeyCache()


def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def hmac_hex(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def payload_mode(value: str) -> PayloadMode | None:
    """The mode an x-amz-content-sha256 value names, None if it names none."""
    if _HEX64.fullmatch(value):
        return PayloadMode.SHA256
    try:
        mode = PayloadMode(value)
    except ValueError:
        return None
    return None if mode is PayloadMode.SHA256 else mode


def header_map(headers: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, value in headers:
        found.setdefault(name.lower(), []).append(value)
    return found


def parse_query(query: str) -> list[tuple[str, str]]:
    """Query pairs, decoded once (a key without '=' has an empty value; '+' stays '+')."""
    pairs = []
    for part in query.split("&"):
        if part:
            key, _, value = part.partition("=")
            pairs.append((_decode(key), _decode(value)))
    return pairs


def _decode(text: str) -> str:
    return unquote_to_bytes(text).decode("utf-8", "surrogateescape")


def _encode(text: str, safe: str = "") -> str:
    """AWS URI encoding: unreserved A-Za-z0-9-._~ kept, everything else %XX uppercase, over UTF-8 bytes."""
    return quote(text.encode("utf-8", "surrogateescape"), safe=safe)


def canonical_uri(raw_path: str) -> str:
    return _encode(_decode(raw_path), safe="/") or "/"


def canonical_query(pairs: Sequence[tuple[str, str]]) -> str:
    return "&".join(f"{k}={v}" for k, v in sorted((_encode(k), _encode(v)) for k, v in pairs))


def canonical_headers(headers: dict[str, list[str]], signed: Sequence[str]) -> str:
    lines = []
    for name in signed:
        values = headers.get(name)
        if values is None:
            raise S3Error("SignatureDoesNotMatch", f"The signed header {name} is missing from the request")
        lines.append(f"{name}:{','.join(' '.join(value.split()) for value in values)}\n")
    return "".join(lines)


def string_to_sign(request: WireRequest, headers: dict[str, list[str]], query: Sequence[tuple[str, str]],
                   claim: _Claim, payload_hash: str) -> str:
    canonical = "\n".join((request.method.upper(), canonical_uri(request.path), canonical_query(query),
                           canonical_headers(headers, claim.signed_headers), ";".join(claim.signed_headers),
                           payload_hash))
    return "\n".join((ALGORITHM, claim.amz_date, claim.scope, hashlib.sha256(canonical.encode()).hexdigest()))


def verify(request: WireRequest, secret_for: Callable[[str], str | None], now: datetime) -> Verified:
    """Who signed `request`, or S3Error (403/400) saying why not; a request with no auth at all is anonymous."""
    headers = header_map(request.headers)
    query = parse_query(request.query)
    presigned = any(key in _QUERY_AUTH for key, _ in query)
    if "authorization" in headers and presigned:
        raise S3Error("InvalidArgument", "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
                                         "Signature query string parameter or the Authorization header should be "
                                         "specified")
    if presigned:
        return _verify_presigned(request, headers, query, secret_for, now)
    if "authorization" in headers:
        return _verify_header(request, headers, query, secret_for, now)
    return _anonymous(headers)


def _anonymous(headers: dict[str, list[str]]) -> Verified:
    declared = _single(headers, "x-amz-content-sha256")
    mode = PayloadMode.UNSIGNED if declared is None else _content_mode(declared)
    if mode.chunks_signed:
        raise S3Error("InvalidRequest", "Signed aws-chunked bodies need a signed request")
    return Verified(None, mode, declared.lower() if mode is PayloadMode.SHA256 and declared else None, None)


def _verify_header(request: WireRequest, headers: dict[str, list[str]], query: list[tuple[str, str]],
                   secret_for: Callable[[str], str | None], now: datetime) -> Verified:
    claim = _parse_authorization(_single(headers, "authorization") or "", headers)
    if abs(now - claim.when) > MAX_SKEW:
        raise S3Error("RequestTimeTooSkewed", "The difference between the request time and the current time is "
                                              "too large.")
    declared = _single(headers, "x-amz-content-sha256")
    if declared is None:
        raise S3Error("MissingSecurityHeader", "Your request was missing a required header: x-amz-content-sha256")
    mode = _content_mode(declared)
    return _check(request, headers, query, claim, secret_for, declared, mode, presigned=False)


def _content_mode(declared: str) -> PayloadMode:
    mode = payload_mode(declared)
    if mode is None:
        raise S3Error("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, a STREAMING-* value or "
                                         "a valid sha256 value.")
    return mode


def _check(request: WireRequest, headers: dict[str, list[str]], query: list[tuple[str, str]], claim: _Claim,
           secret_for: Callable[[str], str | None], payload_hash: str, mode: PayloadMode, presigned: bool) -> Verified:
    """The part both auth forms share: the key, then the signature over the canonical request."""
    secret = secret_for(claim.access_key)
    if secret is None:
        raise S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    key = _KEYS.get(secret, claim.date, claim.region)
    expected = hmac_hex(key, string_to_sign(request, headers, query, claim, payload_hash))
    if not hmac.compare_digest(expected, claim.signature):
        raise S3Error("SignatureDoesNotMatch", "The request signature we calculated does not match the signature "
                                               "you provided. Check your key and signing method.")
    return Verified(claim.access_key, mode, payload_hash.lower() if mode is PayloadMode.SHA256 else None,
                    ChunkSigning(key, claim.signature, claim.amz_date, claim.scope), claim.region, presigned)


def _single(headers: dict[str, list[str]], name: str) -> str | None:
    values = headers.get(name)
    return None if values is None else ",".join(value.strip() for value in values)


def _malformed(message: str) -> S3Error:
    return S3Error("AuthorizationHeaderMalformed", message)


def _parse_authorization(value: str, headers: dict[str, list[str]]) -> _Claim:
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise S3Error("InvalidRequest", "The authorization mechanism you have provided is not supported. "
                                        f"Please use {ALGORITHM}.")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, equals, field = part.strip().partition("=")
        if not equals or name in fields:
            raise _malformed(f"The authorization header is malformed; the field {part.strip()!r} is not name=value")
        fields[name] = field.strip()
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise _malformed("The authorization header is malformed; it needs Credential, SignedHeaders and Signature")
    amz_date, when = _request_time(headers)
    return _claim(fields["Credential"], fields["SignedHeaders"], fields["Signature"], amz_date, when, _malformed)


def _claim(credential: str, signed: str, signature: str, amz_date: str, when: datetime,
           error: Callable[[str], S3Error]) -> _Claim:
    """Checks shared by both forms; `error` makes the form's own error (header vs query parameters)."""
    parts = credential.rsplit("/", 4)
    if len(parts) != 5 or not parts[0] or parts[3] != "s3" or parts[4] != "aws4_request" or not parts[2]:
        raise error(f"The credential {credential!r} is malformed; expecting <key>/<YYYYMMDD>/<region>/s3/aws4_request")
    access_key, date, region = parts[0], parts[1], parts[2]
    if date != amz_date[:8]:
        raise error(f"Invalid credential date {date!r}: it is not the date of the request ({amz_date[:8]})")
    names = tuple(signed.split(";"))
    if not all(names) or any(name != name.lower() for name in names):
        raise error(f"The signed headers {signed!r} are malformed")
    if "host" not in names:
        raise error("The host header must be signed")
    if not _SIGNATURE.fullmatch(signature):
        raise error("The signature must be 64 lowercase hex characters")
    return _Claim(access_key, date, region, names, signature, amz_date, when)


def parse_amz_date(value: str) -> datetime | None:
    try:
        return datetime.strptime(value, AMZ_DATE_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def _request_time(headers: dict[str, list[str]]) -> tuple[str, datetime]:
    """x-amz-date, else Date (ISO 8601 basic or an HTTP date); the string to sign always uses the basic form."""
    amz = _single(headers, "x-amz-date")
    when = None if amz is None else parse_amz_date(amz)
    if when is None and amz is None and (date := _single(headers, "date")) is not None:
        when = parse_amz_date(date) or _http_date(date)
    if when is None:
        raise S3Error("AccessDenied", "AWS authentication requires a valid Date or x-amz-date header")
    return when.strftime(AMZ_DATE_FORMAT), when


def _http_date(value: str) -> datetime | None:
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _query_error(message: str) -> S3Error:
    return S3Error("AuthorizationQueryParametersError", message)


def _verify_presigned(request: WireRequest, headers: dict[str, list[str]], query: list[tuple[str, str]],
                      secret_for: Callable[[str], str | None], now: datetime) -> Verified:
    params = dict(query)
    missing = [name for name in _QUERY_AUTH if name not in params]
    if len(query) != len(params) and any(sum(key == name for key, _ in query) > 1 for name in _QUERY_AUTH):
        raise _query_error("An X-Amz-* authentication parameter is repeated")
    if missing:
        raise _query_error(f"Query-string authentication version 4 requires the {', '.join(_QUERY_AUTH)} "
                           f"parameters; missing {', '.join(missing)}")
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise _query_error(f"X-Amz-Algorithm only supports \"{ALGORITHM}\"")
    when = parse_amz_date(params["X-Amz-Date"])
    if when is None:
        raise _query_error("X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"")
    expires = params["X-Amz-Expires"]
    if not expires.isdigit() or not 1 <= int(expires) <= MAX_EXPIRES:
        raise _query_error(f"X-Amz-Expires must be a number of seconds between 1 and {MAX_EXPIRES}")
    if now > when + timedelta(seconds=int(expires)):
        raise S3Error("AccessDenied", "Request has expired")
    if when - now > MAX_SKEW:
        raise S3Error("AccessDenied", "Request is not valid yet")
    claim = _claim(params["X-Amz-Credential"], params["X-Amz-SignedHeaders"], params["X-Amz-Signature"],
                   params["X-Amz-Date"], when, _query_error)
    declared = params.get("X-Amz-Content-Sha256") or _single(headers, "x-amz-content-sha256") or "UNSIGNED-PAYLOAD"
    signed_query = [(key, value) for key, value in query if key != "X-Amz-Signature"]
    return _check(request, headers, signed_query, claim, secret_for, declared, _content_mode(declared),
                  presigned=True)
