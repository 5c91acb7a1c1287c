"""Multipart operations over a real namespace (SQLite), no blob store: an upload id is its key's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore import AsyncClient
from blobstore_server.services.s3 import multipart
from blobstore_server.services.s3.backend import Backend
from blobstore_server.services.s3.config import S3Config
from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.exchange import S3Request, S3Response
from blobstore_server.services.s3.namespace import NamespaceStore
from blobstore_server.services.s3.namespace.store import open_sqlite
from tests.support.s3_requests import s3_request

UNUSED = "http://127.0.0.1:1"  # no operation here reaches the blob store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[NamespaceStore]:
    store = open_sqlite(tmp_path / "ns.sqlite")
    yield store
    store.close()


def perform(store: NamespaceStore, request: S3Request) -> S3Response:
    async def run() -> S3Response:
        async with AsyncClient(UNUSED) as sdk:
            return await multipart.OPERATIONS[request.route.op](Backend(store, sdk, S3Config(access_hosts=[UNUSED])),
                                                                request)
    return asyncio.run(run())


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
