"""Operations over a real namespace (SQLite) with no blob store: the rules S3 applies before any byte moves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore_server.services.s3.copying import copied_checksums
from blobstore_server.services.s3.errors import NOT_CONFIGURED, S3Error
from blobstore_server.services.s3.namespace import NamespaceStore, ObjectRecord
from blobstore_server.services.s3.namespace.store import open_sqlite
from blobstore_server.services.s3.operations import refuse_unsupported
from tests.support.s3_requests import perform, s3_request


@pytest.fixture
def store(tmp_path: Path) -> Iterator[NamespaceStore]:
    store = open_sqlite(tmp_path / "ns.sqlite")
    yield store
    store.close()


COMPLETE = b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>x</ETag></Part></CompleteMultipartUpload>"


@pytest.mark.parametrize(("method", "query", "body"), [
    ("GET", "", b""),  # ListParts
    ("DELETE", "", b""),  # AbortMultipartUpload
    ("POST", "", COMPLETE),  # CompleteMultipartUpload
    ("PUT", "&partNumber=1", b"x"),  # UploadPart
])
def test_an_upload_id_under_another_key_is_no_such_upload(store: NamespaceStore, method: str, query: str,
                                                          body: bytes) -> None:
    bucket = store.create_bucket("photos", "alice")
    upload = store.create_upload("photos", b"a.jpg", "alice")
    elsewhere = s3_request(method, "/photos/b.jpg", f"uploadId={upload.id}{query}", {"content-length": str(len(body))},
                           body, bucket=bucket)
    with pytest.raises(S3Error) as err:
        perform(store, elsewhere)
    assert (err.value.code, err.value.status) == ("NoSuchUpload", 404)
    assert store.get_upload("photos", upload.id) == upload  # still there, untouched
    listed = perform(store, s3_request("GET", "/photos/a.jpg", f"uploadId={upload.id}", bucket=bucket))
    assert listed.status == 200


@pytest.mark.parametrize("number", ["0", "10001"])
def test_a_part_number_outside_1_to_10000_is_refused_before_any_byte_is_stored(store: NamespaceStore,
                                                                              number: str) -> None:
    bucket = store.create_bucket("photos", "alice")
    upload = store.create_upload("photos", b"a.jpg", "alice")
    request = s3_request("PUT", "/photos/a.jpg", f"uploadId={upload.id}&partNumber={number}",
                         {"content-length": "1"}, b"x", bucket=bucket)
    with pytest.raises(S3Error) as err:
        perform(store, request)  # the blob store is unreachable: storing a byte would fail otherwise
    assert err.value.code == "InvalidArgument"


DELETE = b"<Delete><Object><Key>a.jpg</Key></Object></Delete>"
DELETE_MD5 = "FHi1sHTSQ0ZmJt41FeGmdw=="  # base64 of the MD5 of DELETE


@pytest.mark.parametrize(("headers", "answer"), [
    ({}, "InvalidRequest"),
    ({"content-md5": DELETE_MD5}, 200),
    ({"x-amz-checksum-crc32": "R7fyTQ=="}, 200),
    ({"content-md5": "AAAAAAAAAAAAAAAAAAAAAA=="}, "BadDigest"),
])
def test_delete_objects_requires_content_md5_or_a_checksum(store: NamespaceStore, headers: dict[str, str],
                                                           answer: str | int) -> None:
    bucket = store.create_bucket("photos", "alice")
    request = s3_request("POST", "/photos", "delete", {"content-length": str(len(DELETE)), **headers}, DELETE,
                         bucket=bucket)
    try:
        got: str | int = perform(store, request).status
    except S3Error as exc:
        got = exc.code
    assert got == answer


def test_a_copy_keeps_a_whole_objects_checksum_but_not_a_multipart_ones_composite() -> None:
    whole = ObjectRecord(b"a", 3, "e", 0, checksums={"x-amz-checksum-crc32": "NSRBwg=="})
    assert copied_checksums(whole) == {"x-amz-checksum-crc32": "NSRBwg=="}
    multipart = ObjectRecord(b"b", 3, "e-2", 0, checksums={"x-amz-checksum-crc32": "kG1jvw==-2"}, parts_count=2)
    assert copied_checksums(multipart) == {}


@pytest.mark.parametrize(("subresource", "code"), sorted(NOT_CONFIGURED.items()))
def test_a_configuration_the_gateway_never_holds_is_s3s_not_found(store: NamespaceStore, subresource: str,
                                                                 code: str) -> None:
    bucket = store.create_bucket("photos", "alice")
    with pytest.raises(S3Error) as err:
        perform(store, s3_request("GET", "/photos", subresource, bucket=bucket))
    assert (err.value.code, err.value.status) == (code, 404)


@pytest.mark.parametrize(("headers", "refused"), [
    ({"x-amz-server-side-encryption": "AES256"}, False),
    ({"x-amz-server-side-encryption": "aws:kms"}, True),
    ({"x-amz-server-side-encryption-customer-algorithm": "AES256"}, True),
    ({"x-amz-copy-source-server-side-encryption-customer-algorithm": "AES256"}, True),
    ({"x-amz-object-lock-mode": "GOVERNANCE"}, True),
    ({"x-amz-object-lock-legal-hold": "OFF"}, False),
    ({"x-amz-object-lock-legal-hold": "ON"}, True),
    ({"x-amz-bucket-object-lock-enabled": "false"}, False),
    ({"x-amz-bucket-object-lock-enabled": "true"}, True),
])
def test_a_header_asking_for_what_the_gateway_does_not_do_is_not_implemented(headers: dict[str, str],
                                                                            refused: bool) -> None:
    try:
        refuse_unsupported(headers, "/photos/a.jpg")
    except S3Error as exc:
        assert refused and (exc.code, exc.status) == ("NotImplemented", 501)
    else:
        assert not refused
