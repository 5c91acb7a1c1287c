"""S3's reply bodies and object headers as boto3 users see them: a real boto3 client (its serializer, signer, parser
and after-call handlers) talks to a handler that routes the request it sent, asks a real SQLite namespace and
answers with our bytes; nothing leaves the process."""

from __future__ import annotations

import base64
import io
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit
from xml.etree import ElementTree

import boto3
import botocore.session
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.config import Config
from botocore.exceptions import FlexibleChecksumError
from botocore.parsers import RestXMLParser
from urllib3 import HTTPHeaderDict, HTTPResponse

from blobstore_server.services.s3 import replies
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.headers import (
    meta_from_headers,
    not_modified_headers,
    object_headers,
    with_overrides,
)
from blobstore_server.services.s3.namespace import (
    Bucket,
    ListedObject,
    NamespaceStore,
    ObjectMeta,
    ObjectRecord,
    ObjectsPage,
    PartsPage,
    Upload,
    UploadsPage,
    continuation_token,
    open_sqlite,
)
from blobstore_server.services.s3.replies import ListParams
from blobstore_server.services.s3.routing import Op, Route, route

BUCKET, OWNER = "photos", "alice"
T0 = 1_796_000_000_123  # ms; 2026-11-30T00:53:20.123Z
KEYS = [b"a b", b"a+b", b"a%20b", "\u00e9t\u00e9/\u00fc".encode(), b"dir/x", b"dir/y", b"dir/sub/z", b"amp&<>\"'",
        b"ctl\x01", b"cr\rlf\n", b"tab\t", "\u65e5\u672c/\u8a9e".encode(), b"\xff\xfe raw", b"~tilde*", b"q?=#;"]
Headers = list[tuple[str, str]]
Reply = Callable[[Route, AWSPreparedRequest], tuple[int, Headers, bytes]]


def etag_of(key: bytes) -> str:
    return zlib.crc32(key).to_bytes(4, "big").hex() * 4


def seen(key: bytes) -> str:
    """A key as a boto3 user sees it once botocore url-decoded it (non-UTF-8 bytes become U+FFFD)."""
    return key.decode("utf-8", "replace")


class Wire:
    """boto3's HTTP layer replaced by `reply`: each request is routed as the gateway routes it."""

    reply: Reply
    sent: list[AWSPreparedRequest]

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.reply, self.sent = (lambda route_, request: (200, [], b"")), []

    def __call__(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        self.sent.append(request)
        url = urlsplit(request.url)
        headers = {name.lower() for name in request.headers}
        found = route(request.method, url.path, url.query, "x-amz-copy-source" in headers)
        status, reply_headers, body = self.reply(found, request)
        if not any(name.lower() == "content-length" for name, _ in reply_headers):
            reply_headers = [*reply_headers, ("Content-Length", str(len(body)))]
        raw = HTTPResponse(body=io.BytesIO(body), headers=HTTPHeaderDict(reply_headers), status=status,
                           preload_content=False, decode_content=False,
                           request_method=request.method)
        return AWSResponse(request.url, status, raw.headers, raw)


@pytest.fixture(scope="module")
def shared_wire() -> Wire:
    return Wire()


@pytest.fixture
def wire(shared_wire: Wire) -> Wire:
    shared_wire.reset()
    return shared_wire


@pytest.fixture(scope="module")
def s3(shared_wire: Wire) -> Any:
    """One client for the module (building one takes half a second)."""
    session = boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                                    region_name="us-east-1")
    client = session.client("s3", endpoint_url="http://127.0.0.1:9", config=Config(
        s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    client.meta.events.register("before-send.s3", shared_wire)
    return client


@pytest.fixture
def store(tmp_path: Path) -> Iterator[NamespaceStore]:
    store = open_sqlite(tmp_path / "ns.sqlite")
    store.create_bucket(BUCKET, OWNER)
    for n, key in enumerate(KEYS):
        store.commit_object(BUCKET, ObjectRecord(key, 10 + n, etag_of(key), T0 + n), None)
    yield store
    store.close()


def listing(store: NamespaceStore) -> Reply:
    """The gateway's listing path: query -> ListParams -> store -> reply body."""
    render = {Op.LIST_OBJECTS: replies.list_objects, Op.LIST_OBJECTS_V2: replies.list_objects_v2,
              Op.LIST_OBJECT_VERSIONS: replies.list_object_versions}

    def reply(found: Route, _: AWSPreparedRequest) -> tuple[int, Headers, bytes]:
        params = ListParams.from_query(found.op, found.query)
        if found.op is Op.LIST_MULTIPART_UPLOADS:
            uploads = store.list_uploads(found.bucket, params.prefix, params.delimiter, params.marker,
                                         params.upload_id_marker, params.max_keys)
            return 200, [], replies.list_multipart_uploads(found.bucket, params, uploads)
        page = store.list_objects(found.bucket, params.prefix, params.delimiter, params.after(), params.max_keys)
        return 200, [], render[found.op](found.bucket, params, page, OWNER)
    return reply


def pages(s3: Any, operation: str, **kwargs: Any) -> list[dict[str, Any]]:
    return list(s3.get_paginator(operation).paginate(Bucket=BUCKET, **kwargs))


def stamp(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


# listings through boto3 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 4, 1000])
def test_list_objects_v2_pages_every_key_back_as_boto3_users_see_it(s3: Any, wire: Wire, store: NamespaceStore,
                                                                      page_size: int) -> None:
    wire.reply = listing(store)
    got = pages(s3, "list_objects_v2", PaginationConfig={"PageSize": page_size})
    contents = [obj for page in got for obj in page.get("Contents", [])]
    ordered = sorted(KEYS)
    assert [obj["Key"] for obj in contents] == [seen(key) for key in ordered]
    assert [obj["Size"] for obj in contents] == [10 + KEYS.index(key) for key in ordered]
    assert [obj["ETag"] for obj in contents] == [f'"{etag_of(key)}"' for key in ordered]
    assert contents[0]["LastModified"] == stamp(T0 + KEYS.index(ordered[0]))
    assert all(obj["StorageClass"] == "STANDARD" and "Owner" not in obj for obj in contents)
    assert all(page["KeyCount"] == len(page.get("Contents", [])) and page["MaxKeys"] == page_size for page in got)
    assert [page["IsTruncated"] for page in got] == [True] * (len(got) - 1) + [False]
    assert "NextContinuationToken" not in got[-1]
    assert all(b"encoding-type=url" in request.url.encode() for request in wire.sent)


def test_list_objects_v2_rolls_up_prefixes_and_echoes_start_after_and_owner(s3: Any, wire: Wire,
                                                                              store: NamespaceStore) -> None:
    wire.reply = listing(store)
    got = pages(s3, "list_objects_v2", Delimiter="/", StartAfter="a b", FetchOwner=True,
                PaginationConfig={"PageSize": 2})
    prefixes = [p["Prefix"] for page in got for p in page.get("CommonPrefixes", [])]
    keys = [obj["Key"] for page in got for obj in page.get("Contents", [])]
    assert prefixes == ["dir/", "\u00e9t\u00e9/", "\u65e5\u672c/"]
    assert keys == [seen(k) for k in sorted(KEYS) if k > b"a b" and b"/" not in k]
    assert all(obj["Owner"] == {"ID": OWNER, "DisplayName": OWNER} for page in got for obj in page.get("Contents", []))
    assert got[0]["StartAfter"] == "a b" and got[0]["Delimiter"] == "/"
    assert got[1]["ContinuationToken"] == got[0]["NextContinuationToken"]
    assert all(page["KeyCount"] == len(page.get("Contents", [])) + len(page.get("CommonPrefixes", []))
               for page in got)
    inside = s3.list_objects_v2(Bucket=BUCKET, Prefix="dir/", Delimiter="/")
    assert [p["Prefix"] for p in inside["CommonPrefixes"]] == ["dir/sub/"] and inside["Prefix"] == "dir/"
    assert [obj["Key"] for obj in inside["Contents"]] == ["dir/x", "dir/y"]


@pytest.mark.parametrize("delimiter", ["", "/"])
def test_list_objects_v1_pages_with_markers(s3: Any, wire: Wire, store: NamespaceStore, delimiter: str) -> None:
    wire.reply = listing(store)
    got = pages(s3, "list_objects", Delimiter=delimiter, PaginationConfig={"PageSize": 3})
    keys = [obj["Key"] for page in got for obj in page.get("Contents", [])]
    prefixes = [p["Prefix"] for page in got for p in page.get("CommonPrefixes", [])]
    expected = [k for k in sorted(KEYS) if not delimiter or b"/" not in k]
    assert keys == [seen(k) for k in expected]
    assert len(prefixes) == (3 if delimiter else 0)
    assert all(obj["Owner"] == {"ID": OWNER, "DisplayName": OWNER} for page in got for obj in page.get("Contents", []))
    assert [("NextMarker" in page) for page in got] == [bool(delimiter)] * (len(got) - 1) + [False]
    assert got[0]["Marker"] == "" and got[1]["Marker"] in (got[0].get("NextMarker"), got[0]["Contents"][-1]["Key"])


def test_list_object_versions_of_an_unversioned_bucket(s3: Any, wire: Wire, store: NamespaceStore) -> None:
    wire.reply = listing(store)
    got = pages(s3, "list_object_versions", Prefix="dir/", PaginationConfig={"PageSize": 2})
    versions = [v for page in got for v in page.get("Versions", [])]
    assert [v["Key"] for v in versions] == ["dir/sub/z", "dir/x", "dir/y"]
    assert all(v["VersionId"] == "null" and v["IsLatest"] and v["ETag"].startswith('"') for v in versions)
    assert (got[0]["NextKeyMarker"], got[0]["NextVersionIdMarker"], got[0]["IsTruncated"]) == ("dir/x", "null", True)
    assert (got[1]["KeyMarker"], got[1]["VersionIdMarker"], got[1]["IsTruncated"]) == ("dir/x", "null", False)
    assert "NextKeyMarker" not in got[1] and got[0]["Prefix"] == "dir/"


def test_asked_url_encoding_gives_every_key_byte_for_byte(s3: Any, wire: Wire, store: NamespaceStore) -> None:
    """A user who asks for encoding-type=url decodes himself (botocore leaves it alone): every byte comes back,
    those that are not UTF-8 too, and a space is %20 so that '+'-blind decoders read it right."""
    wire.reply = listing(store)
    got = s3.list_objects_v2(Bucket=BUCKET, EncodingType="url", Prefix="a ", StartAfter="a")
    assert got["EncodingType"] == "url" and got["Prefix"] == "a%20" and got["StartAfter"] == "a"
    assert [obj["Key"] for obj in got["Contents"]] == ["a%20b"]
    listed = s3.list_objects_v2(Bucket=BUCKET, EncodingType="url")
    assert sorted(unquote_to_bytes(obj["Key"]) for obj in listed["Contents"]) == sorted(KEYS)
    assert "a%2Bb" in [obj["Key"] for obj in listed["Contents"]]


def test_multipart_uploads_listing(s3: Any, wire: Wire, store: NamespaceStore) -> None:
    ids = [store.create_upload(BUCKET, key, OWNER).id for key in (b"up/one", b"up/two", b"up/two", b"zz top")]
    wire.reply = listing(store)
    got = pages(s3, "list_multipart_uploads", PaginationConfig={"PageSize": 2})
    uploads = [u for page in got for u in page.get("Uploads", [])]
    expected = sorted(zip(["up/one", "up/two", "up/two", "zz top"], ids, strict=True))  # by key, then upload id
    assert [(u["Key"], u["UploadId"]) for u in uploads] == expected
    assert uploads[0]["Initiator"] == uploads[0]["Owner"] == {"ID": OWNER, "DisplayName": OWNER}
    assert uploads[0]["StorageClass"] == "STANDARD" and isinstance(uploads[0]["Initiated"], datetime)
    assert (got[0]["NextKeyMarker"], got[0]["NextUploadIdMarker"]) == expected[1]
    rolled = s3.list_multipart_uploads(Bucket=BUCKET, Delimiter="/", EncodingType="url")
    assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["up/"] and rolled["Uploads"][0]["Key"] == "zz%20top"


# listings without url encoding, through botocore's parser ----------------------------------------------------------

@cache
def s3_model() -> Any:
    return botocore.session.get_session().get_service_model("s3")


def parse(operation: str, body: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    model = s3_model().operation_model(operation)
    response = {"status_code": 200, "headers": HTTPHeaderDict(headers or {}), "body": body}
    parsed: dict[str, Any] = RestXMLParser().parse(response, model.output_shape)
    return parsed


def test_without_url_encoding_xml_special_characters_and_cr_survive() -> None:
    keys = [b"amp&<>\"'", b"cr\rlf\n", b"tab\t", "\u00e9".encode()]
    page = ObjectsPage([ListedObject(k, 1, "e", T0) for k in keys], [b"p&/"], False, None)
    got = parse("ListObjectsV2", replies.list_objects_v2(BUCKET, ListParams(prefix=b"<", delimiter=b"/"), page,
                                                         OWNER))
    assert [obj["Key"] for obj in got["Contents"]] == [k.decode() for k in keys]
    assert got["Prefix"] == "<" and got["CommonPrefixes"] == [{"Prefix": "p&/"}] and "EncodingType" not in got


@pytest.mark.parametrize("key", [b"ctl\x01", b"\xff\xfe", "\ufffe".encode()])
def test_without_url_encoding_an_unwritable_key_is_refused_not_mangled(key: bytes) -> None:
    page = ObjectsPage([ListedObject(key, 1, "e", T0)], [], False, None)
    for render in (replies.list_objects, replies.list_objects_v2, replies.list_object_versions):
        with pytest.raises(S3Error) as err:
            render(BUCKET, ListParams(), page, OWNER)
        assert err.value.code == "InvalidArgument" and "encoding-type=url" in err.value.message
    assert parse("ListObjectsV2", replies.list_objects_v2(BUCKET, ListParams(url=True), page, OWNER))["KeyCount"] == 1


def test_list_params_from_queries() -> None:
    v2 = ListParams.from_query(Op.LIST_OBJECTS_V2, {"list-type": "2", "prefix": "\u00e9", "max-keys": "5000",
                                                    "start-after": "s", "marker": "ignored", "fetch-owner": "TRUE"})
    assert (v2.prefix, v2.max_keys, v2.start_after, v2.marker, v2.fetch_owner, v2.url) == (
        "\u00e9".encode(), 1000, b"s", None, True, False)
    assert v2.after() == b"s"
    token = continuation_token(b"k\xff")
    assert ListParams.from_query(Op.LIST_OBJECTS_V2, {"continuation-token": token, "start-after": "s"}).after() == \
        b"k\xff"
    v1 = ListParams.from_query(Op.LIST_OBJECTS, {"marker": "m", "start-after": "s", "encoding-type": "url"})
    assert (v1.after(), v1.url, v1.start_after) == (b"m", True, None)
    versions = ListParams.from_query(Op.LIST_OBJECT_VERSIONS, {"key-marker": "k", "version-id-marker": "null"})
    assert (versions.after(), versions.version_id_marker) == (b"k", "null")
    uploads = ListParams.from_query(Op.LIST_MULTIPART_UPLOADS, {"max-uploads": "7", "max-keys": "1"})
    assert uploads.max_keys == 7
    for op, query in ((Op.LIST_OBJECTS, {"encoding-type": "base64"}), (Op.LIST_OBJECTS, {"max-keys": "-1"}),
                      (Op.LIST_OBJECTS_V2, {"max-keys": "ten"}), (Op.LIST_OBJECTS_V2, {"max-keys": "\u00b2"}),
                      (Op.LIST_MULTIPART_UPLOADS, {"max-uploads": ""})):
        with pytest.raises(S3Error) as err:
            ListParams.from_query(op, query)
        assert err.value.code == "InvalidArgument"
    assert ListParams.from_query(Op.LIST_OBJECTS_V2, {"continuation-token": ""}).after() is None  # none, echoed
    with pytest.raises(S3Error) as err:
        ListParams.from_query(Op.LIST_OBJECTS_V2, {"continuation-token": "abcd"}).after()
    assert err.value.code == "InvalidArgument"
    with pytest.raises(S3Error) as err:
        ListParams.from_query(Op.LIST_OBJECTS_V2, {"continuation-token": "not base64!"}).after()
    assert err.value.code == "InvalidArgument"


# the other replies -----------------------------------------------------------------------------------------------

def test_list_buckets_location_and_versioning(s3: Any, wire: Wire, store: NamespaceStore) -> None:
    store.create_bucket("zebra", OWNER)
    store.create_bucket("others", "bob")
    wire.reply = lambda found, _: (200, [], replies.list_buckets(store.list_buckets(OWNER), OWNER))
    got = s3.list_buckets()
    assert [b["Name"] for b in got["Buckets"]] == [BUCKET, "zebra"]
    assert all(isinstance(b["CreationDate"], datetime) for b in got["Buckets"])
    assert got["Owner"] == {"ID": OWNER, "DisplayName": OWNER}
    wire.reply = lambda found, _: (200, [], replies.location_constraint())
    assert s3.get_bucket_location(Bucket=BUCKET)["LocationConstraint"] is None
    wire.reply = lambda found, _: (200, [], replies.location_constraint("eu-west-1"))
    assert s3.get_bucket_location(Bucket=BUCKET)["LocationConstraint"] == "eu-west-1"
    wire.reply = lambda found, _: (200, [], replies.versioning_configuration())
    got = s3.get_bucket_versioning(Bucket=BUCKET)
    assert "Status" not in got and "MFADelete" not in got


def test_times_are_iso_with_milliseconds() -> None:
    assert replies.iso_time(T0) == "2026-11-30T00:53:20.123Z"
    assert replies.iso_time(5) == "1970-01-01T00:00:00.005Z"
    body = replies.copy_object_result("abc", T0)
    assert b"<LastModified>2026-11-30T00:53:20.123Z</LastModified>" in body
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<CopyObjectResult xmlns='
                           b'"http://s3.amazonaws.com/doc/2006-03-01/">')


def test_every_reply_is_utf8_xml_in_s3s_namespace() -> None:
    objects = ObjectsPage([ListedObject("\u00e9&".encode(), 1, "e", T0)], [b"p/"], True, b"p/")
    upload = Upload("u", b"k", T0, OWNER)
    bodies = {
        "ListAllMyBucketsResult": replies.list_buckets([Bucket("i", BUCKET, OWNER, T0)], OWNER),
        "LocationConstraint": replies.location_constraint("eu-west-1"),
        "VersioningConfiguration": replies.versioning_configuration(),
        "ListBucketResult": replies.list_objects_v2(BUCKET, ListParams(delimiter=b"/"), objects, OWNER),
        "ListVersionsResult": replies.list_object_versions(BUCKET, ListParams(), objects, OWNER),
        "InitiateMultipartUploadResult": replies.initiate_multipart_upload(BUCKET, b"k\xff", "u"),
        "CompleteMultipartUploadResult": replies.complete_multipart_upload("http://h/b/k", BUCKET, b"k", "e-2",
                                                                            {}),
        "ListPartsResult": replies.list_parts(BUCKET, PartsPage(upload, [], False, None), 0, 1000),
        "ListMultipartUploadsResult": replies.list_multipart_uploads(BUCKET, ListParams(), UploadsPage(
            [upload], [], False, None, None)),
        "CopyObjectResult": replies.copy_object_result("e", T0),
        "CopyPartResult": replies.copy_part_result("e", T0),
        "DeleteResult": replies.delete_result([b"k"], [], False),
    }
    for root, body in bodies.items():
        assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>')
        assert ElementTree.fromstring(body).tag == "{http://s3.amazonaws.com/doc/2006-03-01/}" + root
    assert "k\ufffd" in bodies["InitiateMultipartUploadResult"].decode()


def test_multipart_replies(s3: Any, wire: Wire, store: NamespaceStore) -> None:
    key = "big/\u00e9 file+1"
    wire.reply = lambda found, _: (200, [], replies.initiate_multipart_upload(
        found.bucket, found.key, store.create_upload(found.bucket, found.key, OWNER).id))
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    assert store.get_upload(BUCKET, upload_id).key == key.encode()
    crc = base64.b64encode(b"\x00\x00\x00\x07").decode()
    for number in (1, 2, 3):
        store.put_part(BUCKET, upload_id, number, 100 * number, f"{number:032x}", (), None, {"crc32": crc})

    def parts(found: Route, _: AWSPreparedRequest) -> tuple[int, Headers, bytes]:
        marker, most = int(found.query.get("part-number-marker", "0")), int(found.query.get("max-parts", "1000"))
        page = store.list_parts(found.bucket, found.query["uploadId"], marker, most)
        return 200, [], replies.list_parts(found.bucket, page, marker, most)
    wire.reply = parts
    got = pages(s3, "list_parts", Key=key, UploadId=upload_id, PaginationConfig={"PageSize": 2})
    listed = [p for page in got for p in page["Parts"]]
    assert [(p["PartNumber"], p["Size"], p["ETag"], p["ChecksumCRC32"]) for p in listed] == [
        (n, 100 * n, f'"{n:032x}"', crc) for n in (1, 2, 3)]
    assert (got[0]["Key"], got[0]["UploadId"], got[0]["NextPartNumberMarker"], got[0]["IsTruncated"]) == (
        key, upload_id, 2, True)
    assert got[0]["Initiator"] == {"ID": OWNER, "DisplayName": OWNER} and got[1]["PartNumberMarker"] == 2
    wire.reply = lambda found, _: (200, [], replies.complete_multipart_upload(
        f"http://127.0.0.1:9/{found.bucket}/big/%C3%A9%20file%2B1", found.bucket, found.key, "f" * 32 + "-3",
        {"x-amz-checksum-crc32": "AAAAAA==-3"}))
    done = s3.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id, MultipartUpload={"Parts": [
        {"PartNumber": n, "ETag": f"{n:032x}"} for n in (1, 2, 3)]})
    assert (done["Key"], done["Bucket"], done["ETag"]) == (key, BUCKET, '"' + "f" * 32 + '-3"')
    assert (done["ChecksumCRC32"], done["ChecksumType"]) == ("AAAAAA==-3", "COMPOSITE")
    assert done["Location"].endswith("/photos/big/%C3%A9%20file%2B1")


def test_copy_replies(s3: Any, wire: Wire) -> None:
    wire.reply = lambda found, _: (200, [], replies.copy_object_result("ab" * 16, T0))
    got = s3.copy_object(Bucket=BUCKET, Key="b", CopySource={"Bucket": BUCKET, "Key": "a"})["CopyObjectResult"]
    assert got == {"ETag": '"' + "ab" * 16 + '"', "LastModified": stamp(T0)}
    wire.reply = lambda found, _: (200, [], replies.copy_part_result("cd" * 16, T0))
    got = s3.upload_part_copy(Bucket=BUCKET, Key="b", UploadId="u", PartNumber=1,
                              CopySource={"Bucket": BUCKET, "Key": "a"})["CopyPartResult"]
    assert got == {"ETag": '"' + "cd" * 16 + '"', "LastModified": stamp(T0)}


@pytest.mark.parametrize("quiet", [False, True])
def test_delete_result(s3: Any, wire: Wire, quiet: bool) -> None:
    failure = S3Error("InternalError", "the namespace <is> down")
    wire.reply = lambda found, _: (200, [], replies.delete_result([b"a & b", "\u00e9".encode()], [(b"c<", failure)],
                                                                  quiet))
    got = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in ("a & b", "\u00e9", "c<")],
                                                   "Quiet": quiet})
    assert got.get("Deleted", []) == ([] if quiet else [{"Key": "a & b"}, {"Key": "\u00e9"}])
    assert got["Errors"] == [{"Key": "c<", "Code": "InternalError", "Message": "the namespace <is> down"}]


# object headers ----------------------------------------------------------------------------------------------------

def stored_from_put(s3: Any, wire: Wire, body: bytes, **kwargs: Any) -> ObjectRecord:
    """PUT through boto3; the record the gateway would store of the request's headers."""
    records: list[ObjectRecord] = []

    def put(found: Route, request: AWSPreparedRequest) -> tuple[int, Headers, bytes]:
        headers = {name: value.decode() if isinstance(value, bytes) else value
                   for name, value in request.headers.items()}
        checksums = {name: value for name, value in headers.items() if name.lower().startswith("x-amz-checksum-")}
        records.append(ObjectRecord(found.key, len(body), "0" * 32, T0, meta_from_headers(headers), checksums))
        return 200, [("ETag", '"' + "0" * 32 + '"')], b""
    wire.reply = put
    s3.put_object(Bucket=BUCKET, Key="k", Body=body, **kwargs)
    return records[0]


def serve(wire: Wire, record: ObjectRecord, body: bytes) -> None:
    def get(found: Route, request: AWSPreparedRequest) -> tuple[int, Headers, bytes]:
        checksum_mode = request.headers.get("x-amz-checksum-mode", b"") in (b"ENABLED", "ENABLED")
        headers = with_overrides(object_headers(record, checksum_mode), found.query)
        return 200, [*headers, ("Content-Length", str(record.size))], b"" if request.method == "HEAD" else body
    wire.reply = get


def test_what_a_put_stores_a_get_and_a_head_give_back(s3: Any, wire: Wire) -> None:
    body = b"hello, world"
    record = stored_from_put(s3, wire, body, ContentType="text/plain; charset=utf-8", CacheControl="max-age=60",
                             ContentDisposition='attachment; filename="a b.txt"', ContentEncoding="gzip",
                             ContentLanguage="fr", Expires=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
                             Metadata={"Mtime": "1700000000.5", "color": "blue green"})
    assert record.meta.metadata == {"mtime": "1700000000.5", "color": "blue green"}
    serve(wire, record, body)
    for got in (s3.head_object(Bucket=BUCKET, Key="k"), s3.get_object(Bucket=BUCKET, Key="k")):
        assert got["Metadata"] == {"mtime": "1700000000.5", "color": "blue green"}
        assert (got["ContentType"], got["CacheControl"], got["ContentEncoding"], got["ContentLanguage"]) == (
            "text/plain; charset=utf-8", "max-age=60", "gzip", "fr")
        assert got["ContentDisposition"] == 'attachment; filename="a b.txt"'
        assert got["Expires"] == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
        assert (got["ETag"], got["LastModified"], got["AcceptRanges"]) == ('"' + "0" * 32 + '"',
                                                                         stamp(T0 - T0 % 1000), "bytes")
        assert got["ContentLength"] == len(body)
    assert s3.get_object(Bucket=BUCKET, Key="k")["Body"].read() == body


def test_a_put_with_no_headers_stores_the_default_content_type(s3: Any, wire: Wire) -> None:
    record = stored_from_put(s3, wire, b"x")
    assert record.meta == ObjectMeta()
    serve(wire, record, b"x")
    got = s3.head_object(Bucket=BUCKET, Key="k")
    assert got["ContentType"] == "binary/octet-stream" and got["Metadata"] == {}
    assert "CacheControl" not in got and "ContentEncoding" not in got and "Expires" not in got


def test_stored_checksums_come_back_only_when_asked_and_botocore_checks_them(s3: Any, wire: Wire) -> None:
    body = b"checked bytes"
    record = stored_from_put(s3, wire, body, ChecksumAlgorithm="CRC32")
    crc32 = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    assert record.checksums == {"x-amz-checksum-crc32": crc32}
    serve(wire, record, body)
    assert "ChecksumCRC32" not in s3.head_object(Bucket=BUCKET, Key="k")
    asked = s3.head_object(Bucket=BUCKET, Key="k", ChecksumMode="ENABLED")
    assert (asked["ChecksumCRC32"], asked["ChecksumType"]) == (crc32, "FULL_OBJECT")
    assert s3.get_object(Bucket=BUCKET, Key="k", ChecksumMode="ENABLED")["Body"].read() == body
    wrong = base64.b64encode(b"\x00\x00\x00\x01").decode()
    serve(wire, ObjectRecord(b"k", len(body), "0" * 32, T0, checksums={"crc32": wrong}), body)
    with pytest.raises(FlexibleChecksumError):
        s3.get_object(Bucket=BUCKET, Key="k", ChecksumMode="ENABLED")["Body"].read()


def test_response_overrides_replace_the_stored_headers(s3: Any, wire: Wire) -> None:
    record = ObjectRecord(b"k", 1, "e", T0, ObjectMeta("text/plain", cache_control="no-cache"))
    serve(wire, record, b"x")
    got = s3.get_object(Bucket=BUCKET, Key="k", ResponseContentType="application/json",
                        ResponseContentDisposition="inline", ResponseCacheControl="max-age=1",
                        ResponseContentLanguage="de", ResponseContentEncoding="identity",
                        ResponseExpires=datetime(2031, 1, 1, tzinfo=UTC))
    assert (got["ContentType"], got["ContentDisposition"], got["CacheControl"], got["ContentLanguage"],
            got["ContentEncoding"], got["Expires"]) == ("application/json", "inline", "max-age=1", "de", "identity",
                                                        datetime(2031, 1, 1, tzinfo=UTC))
    assert [name for name, _ in with_overrides([("content-type", "a")], {"response-content-type": "b"})] == [
        "Content-Type"]


def test_a_304_names_the_validators_and_caching_headers_a_200_would_have() -> None:
    record = ObjectRecord(b"k", 1, "e", T0, ObjectMeta("text/plain", cache_control="no-cache", expires="never",
                                                        content_language="fr", metadata={"a": "b"}))
    assert dict(not_modified_headers(record)) == {"ETag": '"e"', "Last-Modified": "Mon, 30 Nov 2026 00:53:20 GMT",
                                                  "Cache-Control": "no-cache", "Expires": "never"}


def test_meta_from_headers_rules() -> None:
    meta = meta_from_headers({"Content-Encoding": "aws-chunked, gzip", "X-Amz-Meta-A": " v ", "x-amz-meta-": "x",
                              "Content-Type": "", "Cache-Control": ""})
    assert meta == ObjectMeta(content_encoding="gzip", metadata={"a": "v"})
    assert meta_from_headers({"content-encoding": "aws-chunked"}).content_encoding is None
    at_limit = {"x-amz-meta-k": "v" * 2047}
    assert meta_from_headers(at_limit).metadata == {"k": "v" * 2047}
    with pytest.raises(S3Error) as err:
        meta_from_headers({"x-amz-meta-k": "v" * 2047, "x-amz-meta-j": ""})
    assert err.value.code == "MetadataTooLarge" and err.value.status == 400
    record = ObjectRecord(b"k", 1, "e", T0, meta_from_headers({"x-amz-meta-\u00e9": "\u00fc" * 1023}))
    assert ("x-amz-meta-\u00e9", "\u00fc" * 1023) in object_headers(record)
