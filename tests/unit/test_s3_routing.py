"""Which operation each S3 request is (path-style), and that everything else answers 501 or 405."""

from __future__ import annotations

import itertools

import pytest

from blobstore_server.services.s3.errors import NOT_CONFIGURED, S3Error
from blobstore_server.services.s3.routing import SUBRESOURCES, Op, path_style, route

CASES = [
    ("GET", "/", "", False, Op.LIST_BUCKETS),
    ("PUT", "/b", "", False, Op.CREATE_BUCKET),
    ("PUT", "/b/", "", False, Op.CREATE_BUCKET),
    ("HEAD", "/b", "", False, Op.HEAD_BUCKET),
    ("DELETE", "/b", "", False, Op.DELETE_BUCKET),
    ("GET", "/b", "location", False, Op.GET_BUCKET_LOCATION),
    ("GET", "/b", "versioning", False, Op.GET_BUCKET_VERSIONING),
    ("GET", "/b", "", False, Op.LIST_OBJECTS),
    ("GET", "/b", "prefix=a&delimiter=%2F&marker=x", False, Op.LIST_OBJECTS),
    ("GET", "/b", "list-type=2&prefix=a%2Fb&continuation-token=t", False, Op.LIST_OBJECTS_V2),
    ("GET", "/b", "versions&prefix=a", False, Op.LIST_OBJECT_VERSIONS),
    ("GET", "/b", "uploads&prefix=a", False, Op.LIST_MULTIPART_UPLOADS),
    ("POST", "/b", "delete", False, Op.DELETE_OBJECTS),
    ("PUT", "/b/k", "", False, Op.PUT_OBJECT),
    ("PUT", "/b/k", "x-id=PutObject", False, Op.PUT_OBJECT),
    ("PUT", "/b/k", "", True, Op.COPY_OBJECT),
    ("GET", "/b/k", "", False, Op.GET_OBJECT),
    ("GET", "/b/k", "response-content-type=text%2Fplain", False, Op.GET_OBJECT),
    ("GET", "/b/k", "versionId=null", False, Op.GET_OBJECT),
    ("HEAD", "/b/k", "", False, Op.HEAD_OBJECT),
    ("GET", "/b/k", "partNumber=2", False, Op.GET_OBJECT),
    ("HEAD", "/b/k", "partNumber=2", False, Op.HEAD_OBJECT),
    ("DELETE", "/b/k", "", False, Op.DELETE_OBJECT),
    ("POST", "/b/k", "uploads", False, Op.CREATE_MULTIPART_UPLOAD),
    ("PUT", "/b/k", "partNumber=3&uploadId=u", False, Op.UPLOAD_PART),
    ("PUT", "/b/k", "uploadId=u&partNumber=3", True, Op.UPLOAD_PART_COPY),
    ("POST", "/b/k", "uploadId=u", False, Op.COMPLETE_MULTIPART_UPLOAD),
    ("DELETE", "/b/k", "uploadId=u", False, Op.ABORT_MULTIPART_UPLOAD),
    ("GET", "/b/k", "uploadId=u&max-parts=2", False, Op.LIST_PARTS),
    *(("GET", "/b", name, False, Op.GET_BUCKET_CONFIGURATION) for name in NOT_CONFIGURED),
]


@pytest.mark.parametrize(("method", "path", "query", "copy", "op"), CASES)
def test_each_supported_request_is_its_operation(method: str, path: str, query: str, copy: bool, op: Op) -> None:
    assert route(method, path, query, copy).op is op


def test_the_key_is_the_percent_decoded_bytes_after_the_bucket() -> None:
    r = route("GET", "/my-bucket/a%20b/%E2%82%AC%2Bc%2F/d+e", "", False)
    assert (r.bucket, r.key) == ("my-bucket", "a b/€+c//d+e".encode())
    assert r.resource == "/my-bucket/a b/€+c//d+e"
    assert route("GET", "/b/%00%7F", "", False).key == b"\x00\x7f"  # any UTF-8 text
    with pytest.raises(S3Error) as err:
        route("PUT", "/b/%FF", "", False)
    assert err.value.code == "InvalidArgument"
    assert route("GET", "/b//x", "", False).key == b"/x"  # a key may start with a slash
    assert route("GET", "/b", "prefix=a%2Fb&max-keys=5", False).query == {"prefix": "a/b", "max-keys": "5"}


def test_every_other_combination_is_refused_with_501_or_405() -> None:
    """Every method on every scope with each single subresource, with and without a copy source: either an
    operation of the table or an S3Error, never another operation by accident."""
    def shape(method: str, path: str, query: str, copy: bool) -> tuple[str, str, frozenset[str], bool]:
        subs = frozenset(part.split("=")[0] for part in query.split("&") if part) & SUBRESOURCES
        return method, path.rstrip("/") or "/", subs, copy

    supported = {shape(*case[:4]) for case in CASES}
    for method, path, sub, copy in itertools.product(("GET", "PUT", "HEAD", "DELETE", "POST", "PATCH", "OPTIONS"),
                                                     ("/", "/b", "/b/k"), [*sorted(SUBRESOURCES), ""],
                                                     (False, True)):
        query = sub if sub not in ("partNumber", "uploadId", "versionId") else f"{sub}=7"
        if shape(method, path, query, copy) in supported:
            continue
        try:
            r = route(method, path, query, copy)
        except S3Error as exc:
            assert exc.code == ("MethodNotAllowed" if method in ("PATCH", "OPTIONS") else "NotImplemented")
            assert exc.status in (405, 501)
            continue
        # the only other requests routed: a copy source header off a PUT is ignored
        assert copy and method != "PUT" and shape(method, path, query, False) in supported, (method, path, query)
        assert r.op is route(method, path, query, False).op


def test_a_real_version_id_and_other_subresources_are_not_implemented() -> None:
    for query in ("versionId=3HL4kqtJlcpXroDTDmJ", "partNumber=1&versionId=3HL4kqtJlcpXroDTDmJ", "acl", "tagging",
                  "attributes"):
        with pytest.raises(S3Error) as err:
            route("GET", "/b/k", query, False)
        assert err.value.code == "NotImplemented"


@pytest.mark.parametrize(("host", "path", "expected"), [
    ("photos.s3.example.com", "/2026/a.jpg", "/photos/2026/a.jpg"),
    ("photos.s3.example.com:9400", "/", "/photos/"),
    ("My.Photos.S3.Example.com.", "/k", "/my.photos/k"),  # a dotted bucket, the host's case and root dot aside
    ("s3.example.com:9400", "/photos/k", "/photos/k"),  # the domain itself: path style
    ("other.example.com", "/photos/k", "/photos/k"),
    ("xs3.example.com", "/k", "/k"),  # not under the domain, only ending like it
    ("127.0.0.1:9400", "/photos/k", "/photos/k"),
    ("[::1]:9400", "/photos/k", "/photos/k"),
    ("photos.s3.internal", "/k", "/photos/k"),  # any of the domains
    ("", "/photos/k", "/photos/k"),
])
def test_virtual_hosted_style_is_rewritten_to_path_style(host: str, path: str, expected: str) -> None:
    assert path_style(host, path, ["s3.example.com", "s3.internal"]) == expected
    assert path_style(host, path, []) == path
